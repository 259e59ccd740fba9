"""Adapters to RL frameworks other than TRL. Each is an optional extra and is never imported by
``import mcadvantage``: import the submodule itself (``import mcadvantage.integrations.verl``)."""
