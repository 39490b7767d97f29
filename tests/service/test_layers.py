"""The layers of the whole tree, read statically (every module's imports, lazy ones included):
worker → service core ← gateway, all → contract (docs/architecture.md). And every error
code the tree uses is in the registry.

    contract   stitchsim.models, .catalogue, .entries, .codes, .failure, .errors, .datasets,
               .jsondepth, .keyredact, .probes, .files, .method, .caveats, .validation:
               nothing of ours outside
               itself, no httpx
               (Report's notebook helpers import the view's frames lazily, at call time)
    view       stitchsim.view, .table, .junit, .gates, .markdown, .frames: the contract only
    sdk, cli   the rest of stitchsim: nothing of the service or the worker
    core       stitchsim_service.core: no gateway, FastAPI/Starlette, torch or worker code
    gateway    stitchsim_service.gateway: no torch, no worker code, not the SDK
    worker     stitchsim_worker (but its engine): no gateway, no FastAPI/Starlette
    engine     stitchsim_worker.engine: the contract and third-party libraries only

Inside the engine, its packages are layers too (ENGINE_LAYERS, bottom to top): a module imports
its own package and the layers below it, never one above. Names for annotations only (under
TYPE_CHECKING) are exempt, as everywhere here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from stitchsim import codes

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {ROOT / "client" / "stitchsim": "stitchsim", ROOT / "service": "stitchsim_service",
            ROOT / "worker": "stitchsim_worker"}
CONTRACT = ("stitchsim.models", "stitchsim.catalogue", "stitchsim.entries", "stitchsim.codes",
            "stitchsim.failure", "stitchsim.errors", "stitchsim.datasets", "stitchsim.jsondepth",
            "stitchsim.keyredact", "stitchsim.probes", "stitchsim.files", "stitchsim.method",
            "stitchsim.caveats", "stitchsim.validation")
VIEW = ("stitchsim.view", "stitchsim.table", "stitchsim.junit", "stitchsim.gates",
        "stitchsim.markdown", "stitchsim.frames")
# Report.to_pandas() and _repr_html_ (a notebook's helpers on the contract's model) import the
# view's frames when called: the one import that runs from the contract to the view.
LAZY_CONTRACT_TO_VIEW = ("stitchsim.frames",)
ENGINE = "stitchsim_worker.engine"
ENGINE_LAYERS = ("core", "data", "measures", "models", "iri", "stitching", "protocols", "job",
                 "")
"""The engine's packages, bottom to top: core (what every part imports: errors, device,
registry, resources, banks, the reference cache, work units, sizes, a job's context and steps),
the data, the figures on tensors, the models, the IRIs, the stitch, the protocols (and fitting
per protocol, the controls), the job; "" is the top: the engine's own surface (its __init__,
warm.py)."""
HTTP_FRAMEWORK = ("fastapi", "starlette")
TORCH = ("torch", "torchvision", "timm")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _layer(module: str) -> str:
    if module == "stitchsim" or _under(module, CONTRACT):
        return "contract"  # the package itself only names the SDK lazily, by string
    if _under(module, VIEW):
        return "view"
    if _under(module, ("stitchsim",)):
        return "sdk"
    if _under(module, ("stitchsim_service.core",)):
        return "core"
    if _under(module, ("stitchsim_service.gateway",)):
        return "gateway"
    if _under(module, ("stitchsim_worker.engine",)):
        return "engine"
    if _under(module, ("stitchsim_worker",)):
        return "worker"
    return "package"  # stitchsim_service/__init__: a docstring


def _forbidden(layer: str, imported: str) -> bool:
    ours = _under(imported, ("stitchsim", "stitchsim_service", "stitchsim_worker"))
    if layer == "contract":
        if _under(imported, LAZY_CONTRACT_TO_VIEW):
            return False
        return (ours and _layer(imported) != "contract") or _under(imported, ("httpx",))
    if layer == "view":
        return (ours and _layer(imported) not in ("contract", "view")) or _under(
            imported, ("httpx",))
    if layer == "sdk":
        return _under(imported, ("stitchsim_service", "stitchsim_worker"))
    if layer == "core":
        return _under(imported, ("stitchsim_service.gateway", "stitchsim_worker", "uvicorn",
                                 *HTTP_FRAMEWORK, *TORCH)) or _layer(imported) == "sdk"
    if layer == "gateway":
        return _under(imported, ("stitchsim_worker", *TORCH)) or _layer(imported) == "sdk"
    if layer == "worker":
        return _under(imported, ("stitchsim_service.gateway", *HTTP_FRAMEWORK))
    if layer == "engine":
        return ours and _layer(imported) not in ("contract", "engine")
    return ours


def _engine_layer(module: str) -> int:
    """The height of an engine module in ENGINE_LAYERS (a top-level module: the surface)."""
    package = module.removeprefix(ENGINE).lstrip(".").split(".")[0]
    return ENGINE_LAYERS.index(package if package in ENGINE_LAYERS else "")


def _upward(module: str, imported: str) -> bool:
    """An engine module importing an engine module of a layer above its own."""
    if not (_under(module, (ENGINE,)) and _under(imported, (ENGINE,))):
        return False
    return _engine_layer(imported) > _engine_layer(module)


def _modules() -> Iterator[tuple[str, Path]]:
    for base, package in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    # Imports under `if TYPE_CHECKING:` never run: names for annotations only.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            # `from package import module` names a module too.
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def test_imports_point_one_way() -> None:
    modules = dict(_modules())
    assert {"stitchsim.models", "stitchsim_service.core.submit",
            "stitchsim_service.gateway.main", "stitchsim_worker.tasks",
            "stitchsim_worker.engine.data.datasets"} <= set(modules)
    bad = []
    for module, path in modules.items():
        layer = _layer(module)
        for line, imported in _imports(module, path):
            # `from x import name`: judge the module x when name is not a module of ours.
            candidates = [imported]
            if imported.rpartition(".")[0] and imported not in modules:
                candidates = [imported.rpartition(".")[0]]
            for target in candidates:
                if _forbidden(layer, target):
                    bad.append(f"{path.relative_to(ROOT)}:{line} ({layer}) imports {target}")
                if _upward(module, target):
                    bad.append(f"{path.relative_to(ROOT)}:{line} (engine layer "
                               f"{ENGINE_LAYERS[_engine_layer(module)] or 'surface'}) imports "
                               f"{target}, a layer above it")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(set(bad)))


def test_every_engine_package_has_its_layer() -> None:
    # A new package must take its place in the order; a top-level module is the surface.
    packages = {p.parent.name for p in (ROOT / "worker" / "engine").glob("*/__init__.py")}
    assert packages == set(ENGINE_LAYERS) - {""}
    tops = {p.stem for p in (ROOT / "worker" / "engine").glob("*.py")}
    assert tops == {"__init__", "warm"}


def test_the_engine_layer_rules_catch_what_they_are_for() -> None:
    # The imports that made job/ both the top and the bottom, and the others that ran upward.
    e = ENGINE
    assert _upward(f"{e}.stitching.activations", f"{e}.job.plan")
    assert _upward(f"{e}.models.robust", f"{e}.protocols.fitting")
    assert _upward(f"{e}.data.pixels", f"{e}.stitching.layer")
    assert _upward(f"{e}.core.context", f"{e}.models.network")
    assert _upward(f"{e}.iri.synthesis", f"{e}.stitching.train")
    assert _upward(f"{e}.models.network", f"{e}.warm")
    # Down, or inside one package: allowed.
    assert not _upward(f"{e}.protocols.controls", f"{e}.core.step")
    assert not _upward(f"{e}.protocols.controls", f"{e}.protocols.fitting")
    assert not _upward(f"{e}.job.run", f"{e}.measures.metrics")
    assert not _upward(f"{e}.warm", f"{e}.models.sources")
    assert not _upward(f"{e}", f"{e}.job.run")
    assert not _upward("stitchsim_worker.runner", f"{e}.core.errors")  # not the engine's rule
    # The order itself: the bottom, then up to the job.
    heights = [_engine_layer(f"{e}.{p}.x") for p in ("core", "data", "measures", "models",
                                                       "iri", "stitching", "protocols", "job")]
    assert heights == sorted(heights) and _engine_layer(f"{e}.warm") == len(ENGINE_LAYERS) - 1


def test_the_layer_rules_catch_what_they_are_for() -> None:
    # The rules themselves, on the imports they exist to refuse.
    assert _forbidden("core", "fastapi") and _forbidden("core", "stitchsim_service.gateway.errors")
    assert _forbidden("core", "torch") and _forbidden("core", "stitchsim.sdk.client")
    assert _forbidden("worker", "stitchsim_service.gateway.main")
    assert _forbidden("worker", "starlette.types")
    assert _forbidden("engine", "stitchsim_service.core.store")
    assert _forbidden("engine", "stitchsim.sdk") and _forbidden("engine", "stitchsim.table")
    assert _forbidden("contract", "httpx") and _forbidden("contract", "stitchsim.view")
    assert _forbidden("gateway", "stitchsim_worker.engine")
    assert not _forbidden("worker", "stitchsim_service.core.jobs")
    assert not _forbidden("engine", "stitchsim.models") and not _forbidden("engine", "timm")
    assert not _forbidden("gateway", "stitchsim.view")


# ---------------------------------------------------------------- the error-code registry

_RAISERS = {"Failure", "ApiError"}


def _codes_used(path: Path) -> Iterator[tuple[int, str]]:
    """String constants the module uses as error codes."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0] if node.args else None
            if name == "Caveat":  # a caveat's code is a catalogue CAVEATS name, not an error
                continue
            if (name in _RAISERS and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                yield node.lineno, first.value
            for kw in node.keywords:
                if kw.arg in ("code", "error_code") and isinstance(kw.value, ast.Constant):
                    yield node.lineno, kw.value.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and key.value == "error_code"
                        and isinstance(value, ast.Constant)):
                    yield node.lineno, value.value
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = getattr(target, "id", None) or getattr(target, "attr", None)
                if name in ("code", "error_code") and isinstance(node.value.value, str):
                    yield node.lineno, node.value.value


def test_every_error_code_in_the_tree_is_registered() -> None:
    used = [(path, line, code) for _, path in _modules() for line, code in _codes_used(path)]
    assert len(used) > 30  # the scan finds them: raised by core, gateway, worker and engine
    unknown = [f"{p.relative_to(ROOT)}:{line}: {code!r}" for p, line, code in used
               if code not in codes.CODES]
    assert not unknown, "codes missing from stitchsim.codes:\n" + "\n".join(unknown)


def _sets_a_code(cls: ast.ClassDef) -> bool:
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            if any((getattr(t, "id", None) or getattr(t, "attr", None)) == "code"
                   for t in targets):
                return True
    return False


def test_one_failure_type_carries_the_codes() -> None:
    """Every class of ours that carries an error code of its own is a Failure (the contract's
    stitchsim.failure), so one type goes from the engine to the client; no second one."""
    classes: dict[str, tuple[list[str], bool, Path]] = {}
    for _, path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [getattr(b, "id", None) or getattr(b, "attr", None) or ""
                         for b in node.bases]
                classes[node.name] = (bases, _sets_a_code(node), path)

    def is_failure(name: str) -> bool:
        return name == "Failure" or any(is_failure(b) for b in classes.get(name, ([],))[0])

    carriers = [name for name, (_, sets, _) in classes.items() if sets]
    assert {"Failure", "SafetensorsError", "UnsupportedFormat"} <= set(carriers)  # found
    others = [f"{classes[n][2].relative_to(ROOT)}: {n}" for n in carriers if not is_failure(n)]
    assert not others, "error types with a code that are not a Failure:\n" + "\n".join(others)


@pytest.mark.parametrize("code", sorted(codes.CODES))
def test_registry_entries_are_coherent(code: str) -> None:
    entry = codes.CODES[code]
    assert entry.code == code and entry.meaning
    if entry.status is not None:
        assert entry.status in (400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 500, 503)
        if entry.status >= 500 or entry.status == 429:
            assert not entry.user_fault and (entry.retry or entry.status == 500)
        if entry.status in (400, 401, 403, 413, 415, 422):
            assert entry.user_fault and not entry.retry


def test_the_codes_the_engine_and_the_jobs_end_with_are_registered() -> None:
    for code in ("invalid_spec", "unknown_arch", "invalid_arch_kwargs", "weights_mismatch",
                 "invalid_checkpoint", "class_mismatch", "unknown_layer", "invalid_input_size",
                 "unknown_dataset", "invalid_dataset", "not_found", "unstitchable_point",
                 "job_too_large", "images_too_small"):
        assert codes.status_of(code) in (404, 422) and codes.CODES[code].user_fault, code
    for code in ("engine_error", "attempts_exhausted", "cancelled", "time_limit",
                 "out_of_memory", "worker_broken", "not_picked_up"):
        entry = codes.CODES[code]
        assert entry.status is None and not entry.user_fault, code
    assert codes.CODES["near_chance"].status is None
    assert codes.CODES["engine_error"].retry is False
    with pytest.raises(KeyError):
        codes.status_of("engine_error")
