"""The web views of a repository: `vrl ui` (a local, read-only web app) and `vrl report`
(the same views as one self-contained HTML file).

Both read commits, manifests and refs only (through `vrl.views`), never tensors, so they
work on a metadata-only clone and never import torch. The browser code and its one
library (uPlot, MIT, vendored under `static/vendor/` with its licence) ship inside the
package: nothing is fetched from the network.
"""
