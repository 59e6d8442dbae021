"""Model definitions that ship with edl (see ``edl.modeldef`` for the contract)."""
