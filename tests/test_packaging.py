"""The installed package carries its C++ templates (non-editable `pip install .` in CI)."""
import importlib.resources
import os

import awq_inductor

REPO_TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc_templates")


def test_installed_package_finds_every_template():
    from awq_inductor.kernels import codegen

    shipped = {name: p.read_bytes() for name, p in codegen.template_files()}
    in_repo = {}
    for d, _, files in os.walk(REPO_TEMPLATES):
        for n in files:
            if n.endswith(".j2"):
                path = os.path.join(d, n)
                in_repo[os.path.relpath(path, REPO_TEMPLATES).replace(os.sep, "/")] = open(path, "rb").read()
    assert in_repo, "no templates in the repository"
    assert shipped == in_repo


def test_codegen_loads_templates_through_the_package():
    from awq_inductor import schemes
    from awq_inductor.kernels import codegen
    src = codegen.render_header(schemes.W4A16, "portable", __import__("torch").float32)
    assert "namespace awq" in src
    if os.environ.get("CI"):
        # CI installs with a plain `pip install .`: the package must not be the source tree.
        assert "site-packages" in awq_inductor.__file__


def test_installed_package_ships_the_tiny_llama():
    # the demo's default model and tests/test_fidelity.py's data are package data of awq_inductor
    from awq_inductor import tiny_model

    res = importlib.resources.files("awq_inductor") / "data" / "tiny_llama"
    names = {p.name for p in res.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "heldout.txt"} <= names
    assert os.path.samefile(tiny_model.checkpoint_dir(), str(res))


def test_pyproject_lists_every_subpackage():
    # `pip install .` ships only the packages pyproject names: a new sub-package missing there
    # imports from a source checkout but not from the installed wheel
    import re

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(repo, "pyproject.toml")).read()
    listed = set(re.findall(r'"(awq_inductor[\w.]*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    found = {"awq_inductor." + os.path.relpath(d, os.path.join(repo, "awq_inductor")).replace(os.sep, ".")
             for d, _, files in os.walk(os.path.join(repo, "awq_inductor")) if "__init__.py" in files
             and "__pycache__" not in d and "csrc_templates" not in d}
    found = {"awq_inductor" if f == "awq_inductor.." else f for f in found} | {"awq_inductor.csrc_templates"}
    assert listed == found
