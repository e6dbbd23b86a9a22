"""Take the fleet-map screenshot in docs/ (docs/fleet-map.png): a real `cohabit serve --fleet`
on a small mixed fleet (a T4, an A100 cut into MIG slices, a GB10 unified-memory box), five
deployments of the tiny GGUF with fixed budgets and one that does not fit, drawn in headless
Chromium. Every engine is stopped before it exits.

    .venv/bin/python -m tests.ui.screenshot docs/fleet-map.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, GIB, serve

FLEET = """\
topology: standalone_cluster
nodes:
  - name: node-a
    gpus:
      - {index: 0, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: "12.4"}
      - index: 1
        vendor: nvidia
        product: NVIDIA A100-SXM4-40GB
        memory: 40GiB
        accel_version: "12.4"
        partitions:
          - {profile: 3g.20gb, memory: 20GiB, uuid: MIG-5c1f0e2a-0001}
          - {profile: 1g.5gb, memory: 5GiB, uuid: MIG-5c1f0e2a-0002}
  - name: spark
    unified_memory: 128GiB
    gpus: [{index: 0, vendor: nvidia, product: NVIDIA GB10, accel_version: "13.0"}]
"""
# Deployed one after another; binpack puts each where the least is left after it.
DEPLOYMENTS = (
    ("chat-small", 6.0),  # → the T4
    ("chat-tiny", 5.5),  # → the T4 beside it (too big for the 1g.5gb slice)
    ("summarizer", 12.0),  # → the 3g.20gb slice, held whole
    ("embedder", 4.8),  # → the 1g.5gb slice, held whole
    ("coder", 24.0),  # → the GB10 pool
)
TOO_BIG = ("reasoner", 100.0)  # 96 GiB are left on the pool: NoFit, recorded as FAILED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for server in serve(Path(tmp), FLEET):
            model_path = server.model_path
            for name, budget_gib in (*DEPLOYMENTS, TOO_BIG):
                model = server.client.post("/models/", json={"name": name, "path": str(model_path)})
                body = {"m_id": model.json()["id"], "vram_allocation": int(budget_gib * GIB)}
                deployment_id = server.client.post("/serving/deploy_model", json=body).json()
                server.wait_status(deployment_id, "FAILED" if name == TOO_BIG[0] else "DEPLOYED")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                try:
                    page = browser.new_page(viewport={"width": 1366, "height": 900})
                    page.goto(server.root + "/")
                    page.wait_for_selector("#deployments tbody tr")
                    page.wait_for_selector("#preview .verdict")
                    page.screenshot(path=str(args.out), full_page=True)
                finally:
                    browser.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
