"""Alert and recording rules generated from the SLO file (``python -m loadlens.codegen.alerts``)."""
