"""Views of saved documents for people: a terminal summary and a self-contained HTML page of a
run report, an audit report or a coverage record (``sglang-warmup report``)."""
