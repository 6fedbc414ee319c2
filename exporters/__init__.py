"""The processes that expose metrics about the system under test: the serving layer with its engines
(``serving``) and the GPU exporter (``gpu``). They import only ``loadlens.contracts`` and ``loadlens.util``."""
