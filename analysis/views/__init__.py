"""How the answers are shown: tables and commands (``cli``), JSON and rows (``answers``), figures
(``figures``, ``figure_plan``, ``compare_figure``, ``curves``, ``transfer``), the MLflow summary and
report (``summary``, ``report``) and the HTTP service (``service``: models, params, cache, app, serve)."""
