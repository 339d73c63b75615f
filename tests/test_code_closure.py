"""Code dependencies from the imports (dpclip.code_closure): the closure worked out by hand on
a small package (dvc.yaml's use of it: tests/pipeline/test_dvc_yaml.py)."""

from __future__ import annotations

from dpclip.code_closure import closure_files


def _package(tmp_path):
    """dpclip/ with: a imports b at the top and c inside a function; b imports .d relatively;
    sub/e imports nothing, sub/__init__ imports a; f is imported by nobody."""
    root = tmp_path / "dpclip"
    (root / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import os\nfrom dpclip import b\n\ndef later():\n    import dpclip.c\n",
        "b.py": "from . import d\n",
        "c.py": "",
        "d.py": "",
        "f.py": "import dpclip.a\n",
        "sub/__init__.py": "from dpclip.a import later\n",
        "sub/e.py": "x = 1\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_the_closure_follows_imports_anywhere_and_the_packages_above(tmp_path):
    package = _package(tmp_path)
    assert closure_files(["dpclip.b"], package) == ["__init__.py", "b.py", "d.py"]
    assert closure_files(["dpclip.a"], package) == ["__init__.py", "a.py", "b.py", "c.py",
                                                    "d.py"]
    # importing sub.e runs sub/__init__.py first, which imports a
    assert closure_files(["dpclip.sub.e"], package) == [
        "__init__.py", "a.py", "b.py", "c.py", "d.py", "sub/__init__.py", "sub/e.py"]


def test_an_edited_file_is_read_again_though_parses_are_cached(tmp_path):
    """The parse of each file is cached on its source text (a stage asks for the closure of
    every run): an import added between two calls is followed by the second."""
    package = _package(tmp_path)
    assert closure_files(["dpclip.b"], package) == ["__init__.py", "b.py", "d.py"]
    (package / "d.py").write_text("import dpclip.c\n")
    assert closure_files(["dpclip.b"], package) == ["__init__.py", "b.py", "c.py", "d.py"]


def test_a_package_that_imports_all_its_modules_brings_them_all(tmp_path):
    """Loaded by name at import time (``pkgutil.iter_modules`` at module level, as the run
    kinds are) counts; loaded by name inside a function (the method discovery) does not."""
    root = _package(tmp_path)
    (root / "kinds").mkdir()
    (root / "kinds" / "__init__.py").write_text(
        "import importlib, pkgutil\nfor m in pkgutil.iter_modules(__path__):\n"
        "    importlib.import_module(f'{__name__}.{m.name}')\n")
    (root / "kinds" / "one.py").write_text("from dpclip import c\n")
    (root / "later").mkdir()
    (root / "later" / "__init__.py").write_text(
        "import importlib, pkgutil\ndef discover():\n"
        "    for m in pkgutil.iter_modules(__path__):\n"
        "        importlib.import_module(f'{__name__}.{m.name}')\n")
    (root / "later" / "two.py").write_text("")
    (root / "user.py").write_text("import dpclip.kinds\nimport dpclip.later\n")
    assert closure_files(["dpclip.user"], root) == [
        "__init__.py", "c.py", "kinds/__init__.py", "kinds/one.py", "later/__init__.py",
        "user.py"]


def test_a_run_depends_on_every_run_kind_and_on_its_own_method_only():
    from dpclip.catalog import BY_NAME
    from dpclip.pipeline.provenance import code_files

    files = code_files(BY_NAME["train"], "dp_sgd")
    assert "src/dpclip/train/runs/private.py" in files  # the DP step's run, loaded by name
    assert "src/dpclip/methods/dp_sgd.py" in files and "src/dpclip/methods/auto_s.py" not in files
