"""`tierserve deploy`: a plan file becomes a running cluster on many hosts (deploy/'s Ansible playbooks).

    tierserve deploy inventory plan.yaml --hosts hosts.yaml --out cluster.yml
    tierserve deploy up -i cluster.yml          # site.yml: install, start, wait, put the plan's policy in force
    tierserve deploy status -i cluster.yml
    tierserve deploy restart -i cluster.yml --limit llm-1   # rolling: one worker at a time, each drained
    tierserve deploy switch new-plan.yaml -i cluster.yml    # live: the new layout's workers start, the old drain
    tierserve deploy down -i cluster.yml [--purge]

Bad input never ends in a traceback: the message says what is wrong and what to do, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLES = """examples:
  tierserve deploy inventory plan.yaml --hosts hosts.yaml --out cluster.yml
  tierserve deploy up -i cluster.yml
  tierserve deploy up -i cluster.yml --transport nixl -- --check --diff   # args after -- go to ansible-playbook
  tierserve deploy restart -i cluster.yml --limit llm-1
  tierserve deploy switch new-plan.yaml -i cluster.yml
  tierserve deploy down -i cluster.yml

hosts.yaml:
  hosts:
    - {name: enc-1, address: 10.0.0.11, gpus: [RTX4090]}
    - {name: llm-1, address: 10.0.0.21, gpus: [{tier: A100, count: 2}]}
  coordinator: llm-1
"""
PLAYBOOKS = {"up": "site.yml", "status": "status.yml", "restart": "rolling_restart.yml", "down": "down.yml"}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `deploy` on the `tierserve` command's subparsers."""
    p = subparsers.add_parser("deploy", help="deploy a plan on many hosts with Ansible (inventory, up, status, "
                                             "restart, switch, down)", description=__doc__, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="deploy_cmd", required=True)
    inv = sub.add_parser("inventory", help="place a plan file on real hosts: write an Ansible inventory",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    inv.add_argument("plan", metavar="PLAN.yaml", help="a plan file `tierserve plan` wrote")
    inv.add_argument("--hosts", required=True, metavar="HOSTS.yaml",
                     help="the real hosts: name, address, GPUs by tier (see the example below)")
    inv.add_argument("--out", metavar="INVENTORY.yml", help="where to write the inventory (default: print it)")
    inv.add_argument("--transport", default="tcp", choices=["tcp", "ucx", "nixl", "local"],
                     help="how embeddings and KV caches cross hosts (default: %(default)s; local: one host only)")
    inv.add_argument("--model-dir", help="the checkpoint directory on every host (default: the tiny model shipped "
                                         "in the package)")
    inv.add_argument("--model-name", help="the name clients use in `model` (default: the directory's name)")
    inv.add_argument("--key-prefix", default="tierserve", help="namespace of the cluster's Redis keys")
    inv.add_argument("--port", type=int, default=8000, help="coordinator HTTP port (default: %(default)s)")
    inv.add_argument("--redis-port", type=int, default=6379, help="Redis port (default: %(default)s)")
    inv.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                     help="the workers' dtype (default: the worker's own, float32)")
    for name, what in (("up", "install (or update) and start everything, wait until every worker is registered, "
                              "put the plan's policy in force; a second run changes nothing"),
                       ("status", "each host's services and the workers the coordinator sees"),
                       ("restart", "restart the workers one at a time (one host at a time), each drained first"),
                       ("down", "stop every service and remove the service definitions (the venv, logs and data "
                                "stay unless --purge)")):
        c = sub.add_parser(name, help=what, description=what)
        _cluster_args(c)
        c.add_argument("--limit", metavar="HOSTS", help="only these hosts (ansible-playbook --limit)")
        if name == "up":
            src = c.add_mutually_exclusive_group()
            src.add_argument("--wheel", metavar="PATH", help="install this tierserve wheel (default: build one from "
                                                             "this checkout)")
            src.add_argument("--package", metavar="SPEC", help="install from the package index, e.g. tierserve==0.1.0")
            c.add_argument("--transport", choices=["tcp", "ucx", "nixl"],
                           help="override the inventory's tierserve_transport")
        if name == "down":
            c.add_argument("--purge", action="store_true", help="also remove the venv, logs and Redis data")
        c.add_argument("ansible_args", nargs=argparse.REMAINDER,
                       help="after --: more ansible-playbook arguments (-v, --check, -e ...)")
    what = ("switch the running cluster to another plan's layout without losing a request: the new workers start "
            "on the least-loaded hosts of their group, are released together once all are registered, then the old "
            "ones drain and stop; the plan's policy is put in force and the inventory rewritten so that `up` "
            "reproduces the result")
    c = sub.add_parser("switch", help=what, description=what)
    c.add_argument("plan", metavar="NEW_PLAN.yaml", help="the plan file to switch to (`tierserve plan` writes it)")
    _cluster_args(c)
    c.add_argument("--start-timeout-s", type=float, default=600.0,
                   help="new workers not all registered by then are stopped, and the old layout stays (default: "
                        "%(default)s)")
    c.add_argument("--playbook-timeout-s", type=float, default=900.0,
                   help="a worker's ansible-playbook run still going after this is killed (default: %(default)s)")
    c.add_argument("--log-dir", metavar="DIR", help="where the playbooks' output goes (default: INVENTORY's name + "
                                                    ".switch-logs/<time> beside it)")
    return p


def _cluster_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("-i", "--inventory", required=True, metavar="INVENTORY.yml", help="the Ansible inventory")
    c.add_argument("--secrets", metavar="PATH", help="the cluster's secrets file (default: INVENTORY's name + "
                                                    ".secrets.yml beside it; `up` creates it, mode 0600)")
    c.add_argument("--playbooks", metavar="DIR", help="deploy/ directory (default: this checkout's)")


def _inventory(a: argparse.Namespace) -> int:
    import yaml

    from coordinator.deploy.hosts import DeployError, load_hosts
    from coordinator.deploy.inventory import InventoryOptions, build_inventory
    from coordinator.planner.planfile import PlanFileError, load_plan

    try:
        plan = load_plan(a.plan)
    except PlanFileError as e:
        raise DeployError(str(e)) from None
    opts = InventoryOptions(transport=a.transport, model_dir=a.model_dir, model_name=a.model_name,
                            key_prefix=a.key_prefix, coordinator_port=a.port, redis_port=a.redis_port, dtype=a.dtype)
    doc = build_inventory(plan, load_hosts(a.hosts), opts)
    text = (f"# tierserve inventory: plan {a.plan} ({plan.model}, {len(plan.nodes)} GPUs) on {a.hosts}\n"
            f"# deploy with: tierserve deploy up -i {a.out or 'THIS_FILE'}\n"
            + yaml.safe_dump(doc, sort_keys=False, width=110))
    if a.out:
        Path(a.out).write_text(text)
        print(f"wrote {a.out}: {sum(len(v.get('encode_node_workers', [])) + len(v.get('llm_node_workers', [])) for v in doc['all']['hosts'].values())} "
              f"workers on {len(doc['all']['hosts'])} hosts")
    else:
        sys.stdout.write(text)
    return 0


def _files(a: argparse.Namespace) -> tuple[Path, Path]:
    """The inventory and the secrets file (checked to exist, except the secrets `up` creates)."""
    from coordinator.deploy.hosts import DeployError
    from coordinator.deploy.runner import ensure_secrets

    inventory = Path(a.inventory)
    if not inventory.is_file():
        raise DeployError(f"no inventory at {inventory}; write one with `tierserve deploy inventory PLAN.yaml "
                          f"--hosts HOSTS.yaml --out {inventory}`")
    secrets = Path(a.secrets) if a.secrets else inventory.with_name(inventory.stem + ".secrets.yml")
    if a.deploy_cmd == "up":
        ensure_secrets(secrets)
    elif not secrets.is_file():
        raise DeployError(f"no secrets file at {secrets} (`tierserve deploy up` writes it); pass --secrets PATH")
    return inventory, secrets


def _switch(a: argparse.Namespace) -> int:
    import time

    from coordinator.deploy.runner import playbooks_dir
    from coordinator.deploy.switch import SwitchOptions, switch

    inventory, secrets = _files(a)
    logs = Path(a.log_dir) if a.log_dir else (inventory.with_name(inventory.stem + ".switch-logs")
                                              / time.strftime("%Y%m%d-%H%M%S"))
    return switch(SwitchOptions(Path(a.plan), inventory, secrets, playbooks_dir(a.playbooks), logs,
                                a.start_timeout_s, a.playbook_timeout_s))


def _playbook(a: argparse.Namespace) -> int:
    from coordinator.deploy.hosts import DeployError
    from coordinator.deploy.runner import Playbook, build_wheel, playbooks_dir

    inventory, secrets = _files(a)
    extra: dict = {}
    if a.deploy_cmd == "up":
        if a.package:
            extra["common_package"] = a.package
        else:
            wheel = Path(a.wheel) if a.wheel else build_wheel(inventory.parent / ".tierserve-dist")
            if not wheel.is_file():
                raise DeployError(f"--wheel {wheel}: no such file")
            extra["common_wheel"] = str(wheel.resolve())
        if a.transport:
            extra["tierserve_transport"] = a.transport
    if a.deploy_cmd == "down" and a.purge:
        extra["common_purge"] = True
    args = [x for x in a.ansible_args if x != "--"] + (["--limit", a.limit] if a.limit else [])
    book = Playbook(inventory.resolve(), playbooks_dir(a.playbooks), secrets.resolve(), extra, args)
    return book.run(PLAYBOOKS[a.deploy_cmd])


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def run(a: argparse.Namespace) -> int:
    """`tierserve deploy ...`; 2 with a message on bad input, else ansible-playbook's exit status."""
    from coordinator.deploy.hosts import DeployError

    try:
        if a.deploy_cmd == "inventory":
            return _inventory(a)
        return _switch(a) if a.deploy_cmd == "switch" else _playbook(a)
    except DeployError as e:
        return _fail(str(e))
