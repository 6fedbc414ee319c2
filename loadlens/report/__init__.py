"""``loadlens report``: the dashboards' queries over a test window as one self-contained HTML page."""
