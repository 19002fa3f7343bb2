"""The testbed's own API client, against the real API server: what every node relies on."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from testbed.kubeapi import KubeClient, path_for

pytestmark = pytest.mark.controlplane

CONFIGMAPS = path_for("v1", "configmaps", namespace="default")


def test_a_watch_delivers_objects_larger_than_the_read_buffer(kubeconfig_path: Path) -> None:
    """A watch event is one line; a large object (a full ResourceSlice, a pod with a big
    annotation) must arrive, not silently end the watch and with it a node's cache."""
    name = f"big-{uuid.uuid4().hex[:6]}"
    payload = "x" * 700_000

    async def scenario() -> int:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        try:
            seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

            async def watch() -> None:
                async for _, obj in client.watch(CONFIGMAPS, {"fieldSelector": f"metadata.name={name}"}):
                    if not seen.done():
                        seen.set_result(len(obj.get("data", {}).get("payload", "")))

            task = asyncio.create_task(watch())
            await client.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {"payload": payload}})
            try:
                return await asyncio.wait_for(seen, 30)
            finally:
                task.cancel()
                await client.delete_if_exists(f"{CONFIGMAPS}/{name}")
        finally:
            await client.close()

    assert asyncio.run(scenario()) == len(payload)


def test_metadata_only_writes_answer_with_metadata_alone(kubeconfig_path: Path) -> None:
    name = f"meta-{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        try:
            body = {"metadata": {"name": name}, "data": {"payload": "y" * 10_000}}
            created = await client.create(CONFIGMAPS, body, metadata_only=True)
            body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
            body["data"] = {"payload": "z"}
            replaced = await client.replace(f"{CONFIGMAPS}/{name}", body, metadata_only=True)
            stored = await client.get(f"{CONFIGMAPS}/{name}")
            await client.delete(f"{CONFIGMAPS}/{name}")
            return created, replaced, stored
        finally:
            await client.close()

    created, replaced, stored = asyncio.run(scenario())
    assert created["kind"] == "PartialObjectMetadata" and "data" not in created
    assert created["metadata"]["name"] == name and created["metadata"]["uid"]  # type: ignore[index]
    assert replaced["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]  # type: ignore[index]
    assert stored["data"] == {"payload": "z"}
