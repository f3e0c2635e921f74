# Marks csrc_templates/ as the package data directory `awq_inductor.csrc_templates`
# (see pyproject.toml); the templates are the *.j2 files beside this file.
