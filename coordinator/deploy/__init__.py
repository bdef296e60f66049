"""Multi-host deployment: a plan file placed on real hosts as an Ansible inventory, and the `tierserve deploy`
commands that run deploy/'s playbooks (nothing here imports deploy/; the playbooks are files it runs)."""
