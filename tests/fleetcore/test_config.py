"""Which stores carry a fleet, and the ``fleet`` key of the config (docs/design.md#fleet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_agent_loop import (
    ConfigError,
    FleetOptions,
    InvalidOptionError,
    JsonlStore,
    MemoryStore,
    SqliteStore,
    load_config,
    open_client,
    open_runtime,
)
from dsh_agent_loop._compose import fleet_options_from_config


@pytest.mark.parametrize("kind", ["memory", "jsonl"])
async def test_a_store_of_one_process_cannot_carry_a_fleet(kind: str, tmp_path: Path) -> None:
    store = MemoryStore() if kind == "memory" else JsonlStore(tmp_path)
    with pytest.raises(ConfigError, match=r"SqliteStore .* or PostgresStore"):
        async with open_runtime(store=store, fleet=FleetOptions()):
            pass  # pragma: no cover - never entered
    with pytest.raises(ConfigError, match=r"not (MemoryStore|JsonlStore)"):
        async with open_client(store):
            pass  # pragma: no cover
    with pytest.raises(ConfigError):
        async with open_client("memory:"):
            pass  # pragma: no cover


def _plugin(block: Any, store: str) -> dict[str, Any]:
    plugin = {"name": "@deepseek-ai/dsh-agent-loop", "config": {"fleet": block}}
    return {"store": store, "plugins": [plugin]}


def test_the_fleet_block_becomes_fleet_options(tmp_path: Path) -> None:
    block = {"workerId": "w-7", "maxAgents": 3, "idleUnloadSeconds": 9, "leaseSeconds": 4}
    cfg = load_config(_plugin(block, f"sqlite:///{tmp_path}/s.db"))
    options = fleet_options_from_config(cfg)
    assert options == FleetOptions(worker_id="w-7", max_agents=3, idle_unload_s=9.0, lease_s=4.0)
    assert fleet_options_from_config(load_config(_plugin({}, "memory:"))) == FleetOptions()


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"maxAgents": 0}, "fleet.maxAgents"),
        ({"idleUnloadSeconds": -1}, "fleet.idleUnloadSeconds"),
        ({"maxAgent": 3}, "fleet.maxAgent"),
    ],
)
def test_a_bad_fleet_block_names_its_key_path(block: Any, path: str) -> None:
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        load_config(_plugin(block, "memory:"))


async def test_a_config_with_a_fleet_block_makes_a_worker(tmp_path: Path) -> None:
    cfg = _plugin({"workerId": "from-config"}, f"sqlite:///{tmp_path}/s.db")
    async with open_runtime(cfg) as rt:
        assert rt.worker is not None
        assert rt.worker.id == "from-config"
        assert rt.fleet is not None
        status = await rt.fleet.status()
        assert [w.worker_id for w in status.workers] == ["from-config"]
    async with open_runtime(store=SqliteStore(tmp_path / "t.db")) as rt:
        assert rt.worker is None
        assert rt.fleet is None


def test_fleet_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match="max_agents"):
        FleetOptions(max_agents=0).validate()
    with pytest.raises(InvalidOptionError, match="idle_unload_s"):
        FleetOptions(idle_unload_s=float("nan")).validate()
