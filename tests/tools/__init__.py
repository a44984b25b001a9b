"""The project's measuring and checking tools, run by hand (`python -m tests.tools.<name>`);
beside the tests because they use the tests' fixtures (tests/net.py, tests/cgroups.py):

- `floods`: the scrape latency under each hostile flood of the listener (docs/deploy.md).
- `viewflood`: the processes view under clients that never read (docs/deploy.md).
- `rulecost`: what the rules cost a real Prometheus (docs/performance.md).
- `waitshapes`: the causes of waiting on live cgroups, against their truth (docs/findings.md).
- `mutation`: the mutation catalogue, each mutant against the tests that must kill it
  (docs/mutation.md).
"""
