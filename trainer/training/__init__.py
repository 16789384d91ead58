"""Training: the custom loop and the `model.fit` adapter over one list of periodic actions, the distributed step and
the parameter-server source, checkpoints and evaluation. Imports the layers below; the commands at the top of the
package (`task`, `runner`, `flags`, `schema_inference`) import it."""
