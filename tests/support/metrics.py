"""Reading Prometheus's text format in tests."""

import re


def value(text, name, **labels):
    """The sample `name{labels}` in a /metrics page, or None."""
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = (
        rf"^{re.escape(name)}\{{{re.escape(selector)}\}} (\S+)$"
        if labels
        else rf"^{re.escape(name)} (\S+)$"
    )
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else None
