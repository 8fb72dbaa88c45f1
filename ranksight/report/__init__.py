"""`ranksight report`: one run of a job, read back from Prometheus and drawn with the shipped
dashboards' own panels (``cli.py`` the command, ``make.py`` the numbers, ``panels.py`` the plots,
``write.py`` the files). Needs matplotlib (``pip install 'ranksight[report]'``); the core never
imports this package."""
