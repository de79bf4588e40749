"""The TypeScript client (clients/typescript) as its users get it: packed from its own directory, installed into a
fresh strict project where the example of clients/typescript/README.md compiles and a misspelt option does not; its generated types
current with docs/openapi.json; its tests (Node's test runner) against one real `memstream serve`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.e2e.conftest import OTHER

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TS = REPO / "clients" / "typescript"
QUIET = {"npm_config_audit": "false", "npm_config_fund": "false", "npm_config_update_notifier": "false"}


@pytest.fixture(scope="session")
def npm() -> str:
    """npm, with the client's packages installed (session-scoped so a skip comes before the server starts)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None or not (TS / "node_modules" / "typescript").is_dir():
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail("the TypeScript client's packages are not installed (scripts/test.sh runs npm ci in "
                        "clients/typescript)")
        pytest.skip("TYPESCRIPT CLIENT NOT TESTED: run `npm ci` in clients/typescript (scripts/test.sh does)")
    return npm


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env={**os.environ, **QUIET}, capture_output=True, text=True, timeout=timeout)


def _package_copy(root: Path) -> Path:
    """The package's own directory alone, at clients/typescript under `root` (its node_modules linked, not
    copied): what a build that reads nothing outside its directory needs."""
    copy = root / "clients" / "typescript"
    shutil.copytree(TS, copy, ignore=shutil.ignore_patterns("node_modules", "dist", "build", "*.tgz"))
    (copy / "node_modules").symlink_to(TS / "node_modules", target_is_directory=True)
    return copy


def test_the_committed_types_are_generated_from_the_checked_in_openapi_document(npm, tmp_path):
    out = _run([npm, "run", "--silent", "generate:check"], TS)
    assert out.returncode == 0, ("clients/typescript/src/api.ts is stale against docs/openapi.json: run `npm run "
                                 "generate` in clients/typescript and commit src/api.ts\n" + out.stdout + out.stderr)

    # The same check on a document that differs by one field fails, so the check compares what it generates.
    copy = _package_copy(tmp_path)
    doc = json.loads((REPO / "docs" / "openapi.json").read_text(encoding="utf-8"))
    del doc["components"]["schemas"]["Evidence"]["properties"]["score"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "openapi.json").write_text(json.dumps(doc), encoding="utf-8")
    stale = _run([npm, "run", "--silent", "generate:check"], copy)
    assert stale.returncode != 0, stale.stdout + stale.stderr


def _readme_example() -> str:
    readme = (TS / "README.md").read_text(encoding="utf-8")
    return re.search(r"```ts\n(.*?)```", readme, re.S).group(1)


CONSUMER_TYPES = """
import { MemstreamClient, MemstreamError, WaitTimeout } from "@memstream/client";
import type { Evidence, EvidenceRole, SearchOptions, components } from "@memstream/client";

export const role: "primary" | "bridge" | "neighbour" | "fill" = ({} as Evidence).role;
export const roles: EvidenceRole[] = ["primary", "bridge", "neighbour", "fill"];
export const score: number = ({} as Evidence).score;
export const options: SearchOptions = { k: 3, max_turns: 10, strategy: "bm25", conversation_id: "c1" };
export type Waited = components["schemas"]["WaitResult"];
// @ts-expect-error max_turns is a number
export const wrong: SearchOptions = { max_turns: "ten" };
export async function check(client: MemstreamClient): Promise<boolean> {
  try {
    return await client.wait({ 0: 1 }, 35);
  } catch (error) {
    if (error instanceof WaitTimeout) return false;
    throw error instanceof MemstreamError ? error : new Error(String(error));
  }
}
"""

MISSPELT = """
import { MemstreamClient } from "@memstream/client";

await new MemstreamClient().search("Who breeds horses?", { conversaton_id: "c1" });
"""


def test_the_package_builds_alone_installs_and_its_types_bite(npm, tmp_path):
    copy = _package_copy(tmp_path / "repo")
    packed = tmp_path / "packed"
    packed.mkdir()
    out = _run([npm, "pack", "--pack-destination", str(packed)], copy)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (tarball,) = packed.glob("*.tgz")

    # Everything the declarations import is in the package.
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        index_d_ts = tar.extractfile("package/dist/index.d.ts").read().decode()
        version = json.loads(tar.extractfile("package/package.json").read())["version"]
    imported = set(re.findall(r'from "\./([^"]+)\.js"', index_d_ts))
    assert imported and {f"package/dist/{m}.d.ts" for m in imported} <= names, (imported, names)

    consumer = tmp_path / "consumer"
    consumer.mkdir()
    (consumer / "package.json").write_text(json.dumps({"name": "consumer", "private": True, "type": "module"}))
    compiler = {"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
                "noEmit": True, "types": ["node"], "typeRoots": [str(TS / "node_modules" / "@types")]}
    for name, files in (("tsconfig.json", ["main.ts", "types.ts"]), ("tsconfig.misspelt.json", ["misspelt.ts"])):
        (consumer / name).write_text(json.dumps({"compilerOptions": compiler, "files": files}))
    (consumer / "main.ts").write_text(_readme_example())
    (consumer / "types.ts").write_text(CONSUMER_TYPES)
    (consumer / "misspelt.ts").write_text(MISSPELT)
    out = _run([npm, "install", "--offline", str(tarball)], consumer)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    tsc = str(TS / "node_modules" / ".bin" / "tsc")
    out = _run([tsc, "-p", "tsconfig.json"], consumer)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    out = _run([tsc, "-p", "tsconfig.misspelt.json"], consumer)
    assert out.returncode != 0 and re.search(r"error TS\d+: .*'conversaton_id'", out.stdout), out.stdout + out.stderr

    # It runs as installed: the entry point resolves, and the User-Agent it sends names the package's version.
    script = """
        const { MemstreamClient, MemstreamError, WaitTimeout } = await import("@memstream/client");
        const sent = [];
        const fetch = async (url, init) => {
          sent.push(init.headers["User-Agent"]);
          return new Response('{"error": {"code": "timeout", "message": "late"}}', { status: 504 });
        };
        const error = await new MemstreamClient({ url: "http://memstream.invalid", fetch }).wait({ 0: 1 }, 0)
          .catch((e) => e);
        const waitTimeout = error instanceof WaitTimeout && error instanceof MemstreamError;
        console.log(JSON.stringify({ sent, waitTimeout }));
    """
    out = _run(["node", "--input-type=module", "-e", script], consumer)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {"sent": [f"memstream-client-ts/{version}"], "waitTimeout": True}


def test_the_typescript_client_against_the_live_server(npm, served):
    env = {**os.environ, "MEMSTREAM_TEST_URL": served.url, "MEMSTREAM_TEST_KEY": served.keys["writer"],
           "MEMSTREAM_TEST_OTHER_TENANT": OTHER}
    out = subprocess.run([npm, "test", "--silent"], cwd=TS, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "# pass 7" in out.stdout and "# fail 0" in out.stdout, out.stdout[-3000:]
