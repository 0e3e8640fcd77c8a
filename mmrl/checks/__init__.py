"""Contract checkers for plugins: ``mmrl check simulator|reward|policy NAME`` and the tests that
sweep them over every registered component. They test an adapter against the contract in
`mmrl.simulator`, `mmrl.reward` and `mmrl.policies.base`."""
