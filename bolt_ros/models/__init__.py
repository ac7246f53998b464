"""Model files shipped with the package: the DFlash drafter for the default chat model (docs/dflash.md).
`bolt_ros.engine.default_models` resolves them by name."""
