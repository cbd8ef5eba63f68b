"""evalrun's built-in Hydra config groups (config.yaml, model/, task/, engine/, ...), Hydra's primary config source
``pkg://evalrun.conf``: a package because Hydra reads a ``pkg://`` source only from a module with an __init__.py."""
