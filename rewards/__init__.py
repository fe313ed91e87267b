"""r1kit's built-in rewards, installed as ``r1kit.rewards`` (this folder is mapped there, so a
user's own module named ``rewards`` never shadows it). Each module holds plain batch reward
functions (see `r1kit.reward_registry` for the contract) registered by name in the
``r1kit.rewards`` entry-point group, exactly as a third-party plug-in registers."""
