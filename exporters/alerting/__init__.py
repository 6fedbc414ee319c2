"""Alert and recording rules generated from the SLO file (``python -m exporters.alerting.generate``)."""
