"""Action definitions: the registry, the decorators, and the built-in ``core`` pack."""
