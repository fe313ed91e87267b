"""r1kit's built-in rewards. Each module holds plain batch reward functions (see
`r1kit.rewards` for the contract) registered by name in the ``r1kit.rewards`` entry-point group,
exactly as a third-party plug-in registers."""
