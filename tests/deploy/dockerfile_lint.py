"""A small Dockerfile reader and the rules our Dockerfile.gpu must keep (no Docker engine here,
so nothing builds the image; this is what can be checked without one)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile.gpu"
CONSTRAINTS = REPO / "constraints.txt"
# The compute stack, which the gateway must never carry.
TORCH_STACK = {"torch", "torchvision", "timm", "triton"}


@dataclass
class Instruction:
    keyword: str
    args: str
    heredoc: str | None = None
    line: int = 0


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: dict[str, Stage]

    def stage(self, name: str) -> Stage:
        return self.stages[name]

    def resolve(self, text: str, stage: Stage | None = None) -> str:
        """Substitute ${ARG} / $ARG with ARG defaults (global, then the stage's own)."""
        args = dict(self.global_args)
        for i in (stage.all("ARG") if stage else []):
            name, _, default = i.args.partition("=")
            if default:
                args[name.strip()] = default.strip().strip('"')
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                      lambda m: args.get(m.group(1), m.group(0)), text)


_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]+)\1")


def parse(text: str) -> Dockerfile:
    lines = text.splitlines()
    instructions: list[Instruction] = []
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        # Continuation lines; comment lines inside a continuation are dropped, as Docker does.
        while line.rstrip().endswith("\\") and i < len(lines):
            nxt = lines[i]
            i += 1
            if nxt.lstrip().startswith("#"):
                continue
            line = line.rstrip()[:-1] + " " + nxt.strip()
        keyword, _, args = line.strip().partition(" ")
        heredoc = None
        m = _HEREDOC.search(args) if keyword.upper() in ("RUN", "COPY") else None
        if m:
            body = []
            while i < len(lines) and lines[i].strip() != m.group(2):
                body.append(lines[i])
                i += 1
            i += 1  # the terminator
            heredoc = "\n".join(body) + "\n"
        instructions.append(Instruction(keyword.upper(), args.strip(), heredoc, start + 1))

    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for ins in instructions:
        if ins.keyword == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", ins.args, re.I)
            assert m, f"line {ins.line}: cannot read FROM {ins.args}"
            current = Stage(m.group(2) or f"stage{len(stages)}", m.group(1))
            stages[current.name] = current
        elif current is None:
            if ins.keyword == "ARG":
                name, _, default = ins.args.partition("=")
                global_args[name.strip()] = default.strip().strip('"')
        else:
            current.instructions.append(ins)
    return Dockerfile(global_args, stages)


def load() -> Dockerfile:
    return parse(DOCKERFILE.read_text())


def shell_commands(script: str) -> list[list[str]]:
    """Simple commands of a shell line, split at ;, &&, || and |, quotes respected."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    commands: list[list[str]] = [[]]
    for tok in lex:
        if tok and set(tok) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def pip_installs(stage: Stage) -> list[list[str]]:
    """Every `pip install …` of a stage's RUN lines, as argument lists."""
    found = []
    for ins in stage.all("RUN"):
        for words in shell_commands(ins.args.split("<<", 1)[0] if ins.heredoc else ins.args):
            for j in range(len(words) - 1):
                # pip, pip3, /opt/venv/bin/pip, python -m pip
                if re.search(r"(^|/)pip3?$", words[j]) and words[j + 1] == "install":
                    found.append(words[j + 2:])
    return found


def requirement_args(args: list[str]) -> list[str]:
    """The positional requirements of a pip install (options and their values left out)."""
    takes_value = {"-c", "--constraint", "-r", "--requirement", "--index-url", "-i",
                   "--extra-index-url", "--target", "-t", "--find-links", "-f"}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in takes_value:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def constraints_pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def copied_sources(stage: Stage) -> list[str]:
    srcs = []
    for ins in stage.all("COPY"):
        words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
        srcs.extend(words[:-1])
    return srcs


def copies_from(stage: Stage) -> list[str]:
    return [m.group(1) for ins in stage.all("COPY")
            for m in [re.search(r"--from=(\S+)", ins.args)] if m]


# ---------------------------------------------------------------- rules


def _cmd(stage: Stage) -> list[str]:
    cmds = stage.all("CMD")
    if not cmds:
        return []
    try:
        value = json.loads(cmds[-1].args)
    except json.JSONDecodeError:
        return shlex.split(cmds[-1].args)
    return [str(v) for v in value]


def gateway_exclude(df: Dockerfile) -> set[str]:
    args = [i.args for i in df.stage("gateway").all("ARG") if i.args.startswith("GATEWAY_EXCLUDE")]
    return set(args[-1].split("=", 1)[1].strip('"').split()) if args else set()


def problems(df: Dockerfile) -> list[str]:
    """Everything wrong with the Dockerfile that can be seen without building it."""
    out: list[str] = []
    missing = {"gateway", "worker"} - set(df.stages)
    if missing:
        return [f"no stage named {m}" for m in sorted(missing)]
    gateway, worker = df.stage("gateway"), df.stage("worker")

    # Bases: CUDA runtime for the worker, the same CUDA version as the torch wheel index.
    worker_base = df.resolve(worker.base, worker)
    cuda = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-(?:cudnn-)?runtime-ubuntu[\d.]+",
                        worker_base)
    if not cuda:
        out.append(f"worker base {worker_base} is not an nvidia/cuda runtime image")
    else:
        index = df.resolve("${TORCH_INDEX_URL}", worker)
        if not index.endswith(f"/cu{cuda.group(1)}{cuda.group(2)}"):
            out.append(f"torch index {index} does not match CUDA {cuda.group(1)}.{cuda.group(2)}")
    if "cuda" in df.resolve(gateway.base, gateway):
        out.append("the gateway is built on a CUDA image")

    # Pins: every pip install constrained, constraints.txt there first, no versions inline.
    text_all = "\n".join(i.args + "\n" + (i.heredoc or "") for s in df.stages.values()
                         for i in s.instructions)
    if re.search(r"\b(torch|torchvision|timm)\s*[=<>~!]=", text_all):
        out.append("a torch-stack version is written into the Dockerfile, not constraints.txt")
    for stage in df.stages.values():
        for args in pip_installs(stage):
            if not ("-c" in args and args[args.index("-c") + 1].endswith("constraints.txt")):
                out.append(f"{stage.name}: pip install {' '.join(args)} is not constrained")
        pip_lines = [i.line for i in stage.all("RUN") if "pip install" in i.args]
        copy_lines = [i.line for i in stage.all("COPY") if "constraints.txt" in i.args]
        if pip_lines and not (copy_lines and copy_lines[0] < pip_lines[0]):
            out.append(f"{stage.name}: constraints.txt is not copied before pip runs")
        for src in copied_sources(stage):
            if "--from" not in src and not (REPO / src).exists():
                out.append(f"{stage.name}: COPY {src}: no such path")

    # The worker: CUDA torch from the index, and the build refuses a CPU-only wheel.
    torch_installs = [a for a in pip_installs(worker) if "torch" in requirement_args(a)]
    if len(torch_installs) != 1 or "--index-url" not in torch_installs[0]:
        out.append("worker: torch is not installed once, from the CUDA wheel index")
    if not any("torch.version.cuda" in i.args for i in worker.all("RUN")):
        out.append("worker: nothing checks that torch is a CUDA build")

    # The gateway: no torch, the package without its dependencies.
    if copies_from(gateway):
        out.append("gateway: copies from another stage")
    if not TORCH_STACK - {"triton"} <= gateway_exclude(df):
        out.append("gateway: GATEWAY_EXCLUDE does not drop torch, torchvision and timm")
    for args in pip_installs(gateway):
        reqs = requirement_args(args)
        named = {re.split(r"[\[<>=!~;@ ]", r)[0].lower() for r in reqs if not r.startswith(".")}
        if named & TORCH_STACK:
            out.append(f"gateway: installs {sorted(named & TORCH_STACK)}")
        if any(r == "." or r.startswith(".[") for r in reqs) and "--no-deps" not in args:
            out.append("gateway: installs the server package with its dependencies (torch)")

    # Runtime: no CUDA before a task, the right commands, not root, health checks.
    for stage in df.stages.values():
        for ins in stage.instructions:
            if ins.keyword in ("RUN", "CMD", "ENTRYPOINT", "HEALTHCHECK") and \
                    "torch.cuda" in ins.args + (ins.heredoc or ""):
                out.append(f"{stage.name} line {ins.line}: touches torch.cuda")
    from tests.deploy.compose_rules import known_settings_vars

    known = known_settings_vars()
    for stage in df.stages.values():
        for ins in stage.all("ENV"):
            for var in re.findall(r"\b(STITCHSIM_[A-Z0-9_]+)=", ins.args):
                if var not in known:
                    out.append(f"{stage.name}: ENV {var} is not a setting")
    if _cmd(gateway) != ["stitchsim-server", "gateway"]:
        out.append(f"gateway: CMD is {_cmd(gateway)}")
    if _cmd(worker)[:2] != ["stitchsim-server", "worker"] or "gpu" not in _cmd(worker):
        out.append(f"worker: CMD is {_cmd(worker)}, not a gpu-queue worker")
    for stage in (gateway, worker):
        users = stage.all("USER")
        if not users or users[-1].args.split(":")[0] in ("root", "0"):
            out.append(f"{stage.name}: runs as root")
        if not stage.all("HEALTHCHECK"):
            out.append(f"{stage.name}: no HEALTHCHECK")
    return out
