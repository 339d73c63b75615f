"""Stage functions: params + input files -> output files, one module per stage
(``dpclip.stages.prepare.prepare``, ...). The CLI (DVC), the Prefect flows and the tests all
call these, and nothing else holds stage logic. The package imports none of them, so that a
process running one stage imports that stage's code only, and a stage's code dependencies
(:mod:`dpclip.code_closure`) do not include every other stage."""
