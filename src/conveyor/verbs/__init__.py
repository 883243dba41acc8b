"""The verbs that change state, one module per aggregate, shared by the SDK, the API and the CLI."""
