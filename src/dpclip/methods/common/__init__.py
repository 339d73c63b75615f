"""Code that several methods share. A method module imports only :mod:`dpclip.methods.base`
and this package, never another method's module, so that a method's DVC cells depend on its
own module (``src/dpclip/methods/<name>.py``) and on shared code only."""
