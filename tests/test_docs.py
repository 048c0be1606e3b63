"""The documentation is checked against the tree, so a renamed script, key or heading breaks a test, not a reader.

- Every relative link in README.md, CHANGELOG.md and docs/*.md resolves: the file, and its ``#anchor`` as GitHub
  derives it from a heading.
- Every command, in a shell block or an inline code span (``python scripts/<x>.py``, ``python -m dpgen...``,
  ``python bench/<x>.py``, ``torchrun ... scripts/<x>.py``, ``sbatch scripts/...``, ``make <target>``,
  ``pytest <path>``), names a script, module, bench or Makefile target that exists; its ``--flags`` occur in that
  script's source and its ``key=value`` arguments are ones the script reads.
- Every ``key=value`` given to scripts/train.py (also through torchrun, sbatch, ``--`` or ``--set``) is composed
  with Hydra against configs/ and the schema, every value of a sweep and every ``a|b`` alternative included;
  placeholders such as ``<run dir>`` only need their key to exist.
- Every repository path and ``dpgen.<module>.<name>`` quoted in code exists.
- Every file reference in a config comment, in the help texts and docstrings of scripts/ and bench/, and in the
  Makefile's comments exists, with the section (``docs/x.md, "A heading"``) or ``#anchor`` it names.
- No user doc (README, CHANGELOG, docs/, config comments, scripts' help) cites a line number.

A failure names the file, the line and the key or target.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "scripts/train.py"
#: scripts whose key=value arguments are Hydra overrides of a primary config (configs/<name>.yaml)
HYDRA_SCRIPTS = {TRAIN: "train", "scripts/audit.py": "audit"}
GROUPS = {"method", "dataset", "eval", "profile", "experiment", "paper_dataset"}
# what a placeholder value stands for when the key's value matters to the composition (config groups, ε)
PLACEHOLDERS = {"m": "dpgan", "method": "dpgan", "d": "fmnist", "dataset": "fmnist", "ε": "10", "eps": "10",
                "inf": "inf"}
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
COMMANDS = {"python", "python3", "torchrun", "sbatch", "make", "pytest"}
REPO_DIRS = ("dpgen/", "configs/", "scripts/", "bench/", "tests/", "notebooks/", "docs/")
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_PLACEHOLDER = re.compile(r"<[^<>]*>")
_SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


# ---- Markdown structure --------------------------------------------------------------------------------------

def split_markdown(text: str) -> tuple[list[tuple[int, str, list[str]]], list[tuple[int, str]]]:
    """(fenced blocks as (first line number, language, lines), prose paragraphs as (first line number, text))."""
    blocks, paragraphs, para, para_start = [], [], [], 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            if para:
                paragraphs.append((para_start, "\n".join(para)))
                para = []
            marker, lang, body = fence.group(1), fence.group(2).lower(), []
            start = i + 2
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            blocks.append((start, lang, body))
        elif line.strip():
            if not para:
                para_start = i + 1
            para.append(line)
        elif para:
            paragraphs.append((para_start, "\n".join(para)))
            para = []
        i += 1
    if para:
        paragraphs.append((para_start, "\n".join(para)))
    return blocks, paragraphs


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    blocks, paragraphs = split_markdown(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for _, para in paragraphs:
        for line in para.splitlines():
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def check_links(doc: Path) -> list[str]:
    errors = []
    _, paragraphs = split_markdown(doc.read_text(encoding="utf-8"))
    for start, para in paragraphs:
        prose = _SPAN.sub(lambda m: " " * len(m.group(0)), para)  # no links inside code spans
        for m in _LINK.finditer(prose):
            target = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            where = f"{_rel(doc)}:{start + prose.count(chr(10), 0, m.start())}"
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            if not dest.exists():
                errors.append(f"{where}: link target {target!r} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                errors.append(f"{where}: link {target!r}: no heading with anchor #{anchor} in {_rel(dest)}")
    return errors


# ---- commands ------------------------------------------------------------------------------------------------

def command_lines(doc: Path) -> list[tuple[int, str]]:
    """(line number, command) for every line of a shell block (continuations joined) and every inline code
    span that starts with a command."""
    out = []
    blocks, paragraphs = split_markdown(doc.read_text(encoding="utf-8"))
    for start, lang, body in blocks:
        if lang not in SHELL_LANGS:
            continue
        joined, first = "", None
        for n, line in enumerate(body, start):
            first = n if first is None else first
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            out.append((first, joined + line))
            joined, first = "", None
        if joined:
            out.append((first, joined))
    for start, para in paragraphs:
        for m in _SPAN.finditer(para):
            words = m.group(2).split()
            words = words[next((i for i, w in enumerate(words) if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)), 0):]
            if len(words) > 1 and words[0] in COMMANDS:
                out.append((start + para.count("\n", 0, m.start()), " ".join(m.group(2).split())))
    return out


def tokens(command: str) -> list[list[str]]:
    """The command's tokens, one list per segment (``&&``, ``;``, ``|`` split it), comments and env prefixes off,
    placeholders kept as one token, optional ``[...]`` brackets removed."""
    command = _PLACEHOLDER.sub(lambda m: m.group(0).replace(" ", "_"), command)
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        words = command.split()
    segments, current = [], []
    for w in words:
        if w in _SEPARATORS:
            segments.append(current)
            current = []
            continue
        w = w.strip("[]") if w not in ("[", "]") else ""
        if w and w not in ("...", ".."):
            current.append(w)
    segments.append(current)
    out = []
    for seg in segments:
        while seg and (re.match(r"^[A-Z_][A-Z0-9_]*=", seg[0]) or seg[0] in ("time", "env")):
            seg = seg[1:]
        if seg:
            out.append(seg)
    return out


@functools.lru_cache(maxsize=None)
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(t for line in text.splitlines() for t in re.findall(r"^([\w.-]+)\s*:(?!=)", line))


@functools.lru_cache(maxsize=None)
def script_keys(path: Path) -> tuple[frozenset[str], str | None, str]:
    """(key=value keys a non-Hydra script reads, a free prefix it accepts, its source). Keys come from its
    ``parse_kv(required=..., optional=...)`` call, or else from the string literals of its source."""
    source = path.read_text(encoding="utf-8")
    keys, prefix = set(), None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "parse_kv":
            for kw in node.keywords:
                if kw.arg == "required" and isinstance(kw.value, (ast.Tuple, ast.List)):
                    keys |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
                elif kw.arg == "optional" and isinstance(kw.value, ast.Dict):
                    keys |= {k.value for k in kw.value.keys if isinstance(k, ast.Constant)}
                elif kw.arg == "allow_extra_prefix" and isinstance(kw.value, ast.Constant):
                    prefix = kw.value.value
    if not keys:
        keys = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return frozenset(keys), prefix, source


def module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin else None


def check_command(where: str, words: list[str]) -> list[str]:
    """Errors for one command segment (``where``: file:line)."""
    head, args = words[0], words[1:]
    if head == "make":
        return [f"{where}: make target {t!r} is not in the Makefile" for t in args
                if not t.startswith("-") and "=" not in t and t not in make_targets()]
    if head == "pytest" or (head in ("python", "python3") and args[:2] == ["-m", "pytest"]):
        paths = [a.split("::")[0] for a in (args[2:] if head != "pytest" else args) if a.startswith("tests/")]
        return [f"{where}: test file {p} does not exist" for p in paths if not (ROOT / p).exists()]
    if head == "torchrun":
        i = next((i for i, a in enumerate(args) if a.endswith(".py")), None)
        if i is None:
            return [f"{where}: torchrun without a script"]
        return _check_script(where, args[i], args[i + 1:])
    if head == "sbatch":
        i = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
        if i is None or not (ROOT / args[i]).is_file():
            return [f"{where}: sbatch script {args[i] if i is not None else ''!r} does not exist"]
        runs_train = TRAIN in (ROOT / args[i]).read_text()
        return check_train_overrides(where, args[i + 1:]) if runs_train else []
    if head in ("python", "python3"):
        if not args:
            return []
        if args[0] == "-m":
            name = args[1] if len(args) > 1 else ""
            if not name.startswith("dpgen"):  # another tool's module (pytest, wilds, ...)
                return []
            path = module_file(name)
            if path is None:
                return [f"{where}: module {name!r} does not exist"]
            return _check_args(where, path, args[2:])
        return _check_script(where, args[0], args[1:])
    return []


def _check_script(where: str, script: str, args: list[str]) -> list[str]:
    path = ROOT / script
    if not path.is_file():
        return [f"{where}: script {script} does not exist"]
    if script in HYDRA_SCRIPTS:
        return check_train_overrides(where, args, HYDRA_SCRIPTS[script])
    return _check_args(where, path, args)


def _check_args(where: str, path: Path, args: list[str]) -> list[str]:
    """--flags must occur in the script; key=value must be a key it reads; after ``--`` (and for ``--set``)
    the values are scripts/train.py overrides, with ``--method``/``--dataset`` as their groups."""
    keys, prefix, source = script_keys(path)
    errors, train, groups = [], [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            train += args[i + 1:]
            break
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            if f'"{flag}"' not in source and f"'{flag}'" not in source:
                errors.append(f"{where}: {_rel(path)} has no option {flag}")
            if flag in ("--method", "--methods", "--dataset") and i + 1 < len(args) and not args[i + 1].startswith("-"):
                groups.append(f"{flag[2:].rstrip('s')}={args[i + 1].split(',')[0]}")
            if flag == "--set" and i + 1 < len(args):
                train.append(args[i + 1])
                i += 1
        elif "=" in a and not a.startswith("-"):
            key = a.split("=", 1)[0]
            if prefix and key.startswith(prefix):
                train.append(a)
            elif key not in keys:
                errors.append(f"{where}: {_rel(path)} does not read {key}=")
        i += 1
    if train:
        parts = _rel(path).split("/")  # dpgen/<method>/x.py trains that method unless told otherwise
        if parts[0] == "dpgen" and (ROOT / "configs" / "method" / f"{parts[1]}.yaml").is_file() \
                and not any(g.startswith("method=") for g in groups):
            groups.append(f"method={parts[1]}")
        errors += check_train_overrides(where, groups + train)
    return errors


# ---- scripts/train.py overrides against the composed config -------------------------------------------------

def _alternatives(value: str) -> tuple[list[str], bool]:
    """(the values to compose, whether the value is only a placeholder). ``a|b`` and sweeps ``a,b`` give each
    value; ``<m>``-style placeholders their stand-in; ``<run_dir>`` (unknown) only asks for the key."""
    if value.startswith(("[", "{", "'", '"')):
        return [value], False
    out, placeholder = [], False
    for part in _split_top(value, ","):
        for alt in _split_top(part, "|"):
            m = re.fullmatch(r"<([^<>]*)>", alt)
            if m:
                inner = [stand_in(x) for x in m.group(1).split("|")]
                if all(x is None for x in inner):
                    placeholder = True
                    continue
                out += [x for x in inner if x is not None]
            elif _PLACEHOLDER.search(alt) or alt in ("", "..", "..."):
                placeholder = True
            else:
                out.append(alt)
    return out, placeholder and not out


def stand_in(placeholder: str) -> str | None:
    """The value a ``<placeholder>`` stands for when composing (None: only its key must exist). ``<folder>``, an
    image folder's path, stands for a real one: composing ``dataset=folder`` lists it to set δ below 1/N."""
    return image_folder() if placeholder == "folder" else PLACEHOLDERS.get(placeholder)


@functools.lru_cache(maxsize=None)
def image_folder() -> str:
    """A folder with train/ and test/, each of two classes of two 28×28 PNGs (removed when the process exits)."""
    import atexit
    import shutil
    import tempfile

    from PIL import Image

    root = Path(tempfile.mkdtemp(prefix="dpgen-docs-folder-"))
    atexit.register(shutil.rmtree, root, True)
    for part in ("train", "test"):
        for cls in ("a", "b"):
            (root / part / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("L", (28, 28), 40 * i).save(root / part / cls / f"{i}.png")
    return str(root)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside <>, [] and {}."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "<[{("
        depth -= ch in ">]})"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _job_error(cfg) -> str | None:
    """What scripts/train.py's check of the job's config (types, ranges, choices; no data) says, or None."""
    from omegaconf import OmegaConf, open_dict

    from dpgen.core.schema import check_config

    job = cfg.copy()
    with open_dict(job):
        job.pop("hydra", None)
    try:
        OmegaConf.resolve(job)
        check_config(job)
    except Exception as exc:  # noqa: BLE001 - any OmegaConf/schema error is the finding
        return _first_line(exc)
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@functools.lru_cache(maxsize=None)
def compose_groups(overrides: tuple[str, ...], config: str = "train") -> tuple[str | None, object]:
    """(first line of Hydra's error or None, the config ``config`` composed with Hydra's node) for config-group
    choices."""
    from hydra import compose, initialize_config_dir

    from dpgen.core.config import register_configs
    from dpgen.core.methods import CONFIG_DIR

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return None, compose(config, overrides=list(overrides), return_hydra_config=True)
    except Exception as exc:  # noqa: BLE001 - any Hydra/OmegaConf/schema error is the finding
        return _first_line(exc), None


def set_value(cfg, key: str, value: str) -> str | None:
    """Set ``key=value`` as Hydra parses it on a composed config (typed by the schema), or say why not."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, read_write

    try:
        parsed = OverridesParser.create().parse_override(f"{key}={value}").value()
        if OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            return "not a key of the composed config"
        with read_write(cfg):
            OmegaConf.update(cfg, key, parsed, merge=False)
    except Exception as exc:  # noqa: BLE001 - a wrong type for the key
        return _first_line(exc)
    return None


def check_train_overrides(where: str, args: list[str], config: str = "train") -> list[str]:
    """Config groups (``method=``, ``hydra/launcher=``, ``+experiment=``) are composed by Hydra, every value of each;
    every other key is set on the composed config as Hydra would, and the job's config is checked as
    scripts/train.py checks it (types, ranges, choices; no data). ``config``: the primary config (audit for
    scripts/audit.py). A command quoted again (results.md's summary and per-draw tables) is checked once."""
    return [e.replace(_WHERE, where, 1) for e in _train_override_errors(tuple(args), config)]


_WHERE = "\0where\0"


@functools.lru_cache(maxsize=None)
def _train_override_errors(args: tuple[str, ...], config: str) -> tuple[str, ...]:
    from omegaconf import OmegaConf

    where = _WHERE

    parsed = []  # (key as written, key, values, placeholder only)
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        values, placeholder = _alternatives(value)
        parsed.append((key, key.lstrip("+~"), values, placeholder))
    is_group = lambda k: k in GROUPS or "/" in k  # noqa: E731
    groups = [(raw, vals) for raw, key, vals, ph in parsed if not ph and is_group(key)]
    values = [(raw, key, vals) for raw, key, vals, ph in parsed if not ph and not is_group(key)]
    base = tuple(f"{raw}={vals[0]}" for raw, vals in groups)
    variants = [base] + [base[:n] + (f"{raw}={v}",) + base[n + 1:] for n, (raw, vals) in enumerate(groups)
                         for v in vals[1:]]
    errors = []
    for variant in variants:
        error, cfg = compose_groups(variant, config)
        if error is not None:  # name the group choice(s) to blame: each one alone
            culprits = [o for o in variant if compose_groups((o,), config)[0]] or list(variant)
            errors += [f"{where}: {o.split('=', 1)[0]}: {compose_groups((o,), config)[0] or error}" for o in culprits]
            continue
        cfg = cfg.copy()
        for raw, key, vals in values:
            error = set_value(cfg, key, vals[0])
            if error:
                errors.append(f"{where}: {raw}: {error}")
        error = _job_error(cfg)
        if error:
            errors.append(f"{where}: {error}")
            continue
        for raw, key, vals in values:  # the other values of a sweep or an a|b choice, one at a time
            for v in vals[1:]:
                other = cfg.copy()
                error = set_value(other, key, v) or _job_error(other)
                if error:
                    errors.append(f"{where}: {raw}: {error}")
        for raw, key, _, placeholder in parsed:
            if placeholder and not is_group(key) and OmegaConf.select(cfg, key, default=KeyError) is KeyError:
                errors.append(f"{where}: {key}: not a key of the composed config")
    return tuple(sorted(set(errors)))


# ---- quoted paths and Python names ---------------------------------------------------------------------------

def check_names(doc: Path) -> list[str]:
    errors = []
    _, paragraphs = split_markdown(doc.read_text(encoding="utf-8"))
    for start, para in paragraphs:
        for m in _SPAN.finditer(para):
            span = m.group(2).strip()
            where = f"{_rel(doc)}:{start + para.count(chr(10), 0, m.start())}"
            if span.startswith(REPO_DIRS) and re.fullmatch(r"[\w./-]+", span):
                if not (ROOT / span).exists():
                    errors.append(f"{where}: path {span} does not exist")
            elif re.fullmatch(r"dpgen(\.\w+)+", span) and not _resolves(span):
                errors.append(f"{where}: {span} does not exist")
    return errors


@functools.lru_cache(maxsize=None)
def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if module_file(name) is None:
            continue
        obj = importlib.import_module(name)
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def check_doc(doc: Path) -> list[str]:
    errors = check_links(doc) + check_names(doc)
    for line, command in command_lines(doc):
        for words in tokens(command):
            errors += check_command(f"{_rel(doc)}:{line}", words)
    return errors


# ---- file references outside the pages: config comments, scripts' help, the Makefile -------------------------

_FILE_REF = re.compile(
    r"(?<![\w/.<-])(?P<file>(?:README|CHANGELOG)(?:\.md)?\b|(?:docs|configs|scripts|bench|tests|dpgen|notebooks)/"
    r"[\w./<>*-]*[\w>*]|[\w-]+\.md\b)"
    r"(?:#(?P<anchor>[\w-]+))?(?:(?:'s)?,?\s+(?:section\s+)?[\"“](?P<section>[^\"”]{2,80})[\"”])?")
_LINE_NUMBER = re.compile(r"\b[\w/.-]+\.(?:py|md|yaml|ipynb|toml):\d+\b|\blines?\s+\d+(?:\s*[-–]\s*\d+)?\s+(?:of|in)\s+"
                          r"[\w/.-]+\.(?:py|md|yaml|ipynb|toml)\b")


def reference_texts() -> list[tuple[str, str]]:
    """(where, text) of the texts besides the pages that cite files: config comments, the string literals of
    scripts/, bench/ and the ``python -m dpgen...`` entry points (docstrings, help texts, usage lines), and the
    Makefile's and sbatch scripts' comments."""
    out = []
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "#" in line:
                out.append((f"{_rel(path)}:{n}", line.split("#", 1)[1]))
    entry_points = [p for p in (ROOT / "dpgen").rglob("*.py") if '__name__ == "__main__"' in p.read_text(encoding="utf-8")]
    for path in sorted([*(ROOT / "scripts").rglob("*.py"), *(ROOT / "bench").glob("*.py"), *entry_points]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append((f"{_rel(path)}:{node.lineno}", node.value))
    for path in sorted((ROOT / "scripts").rglob("*.sbatch")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#") and not line.startswith("#SBATCH"):
                out.append((f"{_rel(path)}:{n}", line))
    for n, line in enumerate((ROOT / "Makefile").read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("#"):
            out.append((f"Makefile:{n}", line))
    return out


#: files that scripts write (not repository files) which help texts name
OUTPUT_FILES = {"results_vs_paper.md", "gpu_check.md", "gpu_profile.md", "feta_step.md"}


def _resolve(name: str) -> Path | None:
    """The file or folder a reference names (placeholders and globs must match something), or None."""
    if name in ("README", "CHANGELOG"):
        name += ".md"
    pattern = re.sub(r"<[^<>]*>", "*", name)
    for base in (ROOT, ROOT / "docs"):
        hits = sorted(base.glob(pattern)) if "*" in pattern else [base / pattern] if (base / pattern).exists() else []
        if hits:
            return hits[0]
    return None


def check_references(where: str, text: str) -> list[str]:
    errors = []
    for m in _FILE_REF.finditer(text):
        name = m.group("file")
        if name.endswith(".") or "{" in name or name in OUTPUT_FILES:
            continue
        target = _resolve(name)
        if target is None:
            errors.append(f"{where}: {name} does not exist")
            continue
        if target.suffix != ".md" or "*" in name or "<" in name:
            continue
        section = " ".join(m.group("section").split()) if m.group("section") else None
        for anchor in filter(None, (m.group("anchor"), section and slug(section))):
            if anchor not in anchors(target):
                errors.append(f"{where}: {name} has no section {section or '#' + anchor!r}")
    for m in _LINE_NUMBER.finditer(text):
        errors.append(f"{where}: cites a line number ({m.group(0)}); cite the file and section instead")
    return errors


# ---- tests ---------------------------------------------------------------------------------------------------

def test_readme_is_the_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"
    assert (ROOT / "docs").is_dir() and (ROOT / "CHANGELOG.md").is_file()


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: _rel(p))
def test_links_commands_and_keys_in_the_docs_exist(doc):
    errors = check_doc(doc)
    assert not errors, "\n".join(errors)


@pytest.fixture
def write_doc(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "page.md"
        path.write_text(text, encoding="utf-8")
        (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
        return path
    return write


def test_a_made_up_config_key_fails_naming_file_line_and_key(write_doc):
    doc = write_doc("# T\n\nIntro.\n\n```bash\npython scripts/train.py method=gpate eps=1,10 gpate.no_such_key=3\n```\n")
    errors = check_doc(doc)
    assert len(errors) == 1 and "page.md:6: gpate.no_such_key" in errors[0], errors


def test_the_real_keys_of_that_command_pass(write_doc):
    doc = write_doc("```bash\npython scripts/train.py -m method=gpate,dpac eps=1,10 threads=1 "
                    "resume=<run dir> hydra/launcher=slurm hydra.launcher.partition=<p>\n```\n")
    assert check_doc(doc) == []


@pytest.mark.parametrize("text, expected", [
    ("Run `python scripts/train.py dpgan.itres=5` now.\n", "page.md:1: dpgan.itres"),
    ("```bash\npython scripts/train.py -m eps=1,abc\n```\n", "page.md:2: eps"),
    ("```bash\npython scripts/train.py -m method=dpgan,nosuch\n```\n", "page.md:2: method"),
    ("```bash\npython scripts/train.py resume=<run dir> no_key=<x>\n```\n", "page.md:2: no_key: not a key"),
    ("```bash\ntorchrun --nproc_per_node=2 scripts/train.py feta.nokey=1\n```\n", "page.md:2: feta.nokey"),
    ("```bash\nsbatch scripts/slurm/multinode.sbatch dpgan.nokey=1\n```\n", "page.md:2: dpgan.nokey"),
    ("```bash\npython scripts/audit.py method=dpgan audit.canaries=abc\n```\n", "page.md:2: audit.canaries"),
    ("```bash\npython scripts/audit.py audit.no_key=1\n```\n", "page.md:2: audit.no_key"),
    ("```bash\npython scripts/evaluate.py run=x eval.no_key=1\n```\n", "page.md:2: eval.no_key"),
    ("```bash\npython scripts/sample.py run=x n=3 out=y.npz colour=red\n```\n", "does not read colour="),
    ("```bash\npython bench/gpu_profile.py --no-such-flag\n```\n", "has no option --no-such-flag"),
    ("```bash\npython -m dpgen.dpac.diagnose --eps 10 -- dpac.nokey=1\n```\n", "page.md:2: dpac.nokey"),
    ("```bash\npython scripts/nope.py\n```\n", "script scripts/nope.py does not exist"),
    ("```bash\npython -m dpgen.nope\n```\n", "module 'dpgen.nope' does not exist"),
    ("```bash\nmake demo nope\n```\n", "make target 'nope'"),
    ("See [the page](missing.md).\n", "link target 'missing.md' does not exist"),
    ("See [the page](other.md#no-section).\n", "no heading with anchor #no-section"),
    ("See [here](#nowhere).\n", "no heading with anchor #nowhere"),
    ("The file `dpgen/core/nothing.py` holds it.\n", "path dpgen/core/nothing.py does not exist"),
    ("`dpgen.core.devices.NO_SUCH_NAME` says so.\n", "dpgen.core.devices.NO_SUCH_NAME does not exist"),
])
def test_each_kind_of_stale_reference_is_caught(write_doc, text, expected):
    errors = check_doc(write_doc(text))
    assert any(expected in e for e in errors), errors


def test_valid_references_pass(write_doc):
    doc = write_doc("# Title\n\n## A `code` heading, with punctuation!\n\nSee [it](#a-code-heading-with-punctuation), "
                    "[other](other.md#a-section), [web](https://example.org) and `dpgen.core.devices.PEAK_GB`.\n\n"
                    "```bash\nOMP_NUM_THREADS=1 python scripts/train.py method=<m> dataset=<d> eps=<ε|inf> "
                    "[profile=quick|paper] [delta=..]  # a comment\nmake test\n"
                    "python scripts/sample.py run=<run dir> n=60000 out=<file.npz> [labels=0,1,...]\n"
                    "python scripts/audit.py method=<m> dataset=digits eps=1,4,inf audit.canaries=1000 "
                    "audit.guesses=250\n```\n")
    assert check_doc(doc) == []


def test_file_references_in_configs_scripts_and_the_makefile_exist():
    errors = [e for where, text in reference_texts() for e in check_references(where, text)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: _rel(p))
def test_user_docs_cite_no_line_numbers(doc):
    errors = [e for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
              for e in check_references(f"{_rel(doc)}:{n}", line) if "line number" in e]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("text, expected", [
    ("see README \"Auditing\"", "README has no section"),
    ("(official-code.md section 1)", "official-code.md does not exist"),
    ("docs/clusters.md, \"No such heading\"", "has no section"),
    ("configs/method/nope.yaml", "does not exist"),
    ("the check in dpgen/core/schema.py:120", "cites a line number"),
    ("see line 12 of scripts/train.py", "cites a line number"),
])
def test_each_kind_of_dangling_reference_is_caught(text, expected):
    errors = check_references("here", text)
    assert any(expected in e for e in errors), errors


def test_valid_references_pass():
    text = ('docs/clusters.md, "Offline GPU nodes"; docs/usage.md#run-outputs; configs/method/<m>.yaml; '
            'configs/method/*.yaml; dpgen/audit/; README.md; Alg. 1 line 9')
    assert check_references("here", text) == []
