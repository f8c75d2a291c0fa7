"""``hydra/launcher=batched``: the jobs of a sweep that read the same data run in one process, sharing it.

Hydra finds launcher plugins by importing every module under the ``hydra_plugins`` namespace
package (``hydra.core.plugins.Plugins``), so this package must stay cheap to import: no torch
at module level.
"""
