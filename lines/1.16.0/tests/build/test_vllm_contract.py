"""The vLLM API that TRL 1.16.0's `VLLMClient` relies on, checked against real vLLM wheels without importing vLLM.

TRL 1.16.0 generates through vLLM's own server and sends it the trainer's weights with vLLM's NCCL weight-transfer
engine: `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'` on the server side;
on the trainer's side `VLLMClient` (trl/generation/vllm_client.py) calls HTTP routes and vLLM's trainer helpers. The
contract is read from the client itself (`Client`, with `ast`): the vLLM names it imports and calls, the route each
of its methods requests with the JSON body and query parameters it sends, the dicts it sends as `init_info` /
`update_info`, and the vLLM versions at which it switches (`is_vllm_available(min_version=...)`), so a change to the
client changes what is checked. Each entry is checked on the sources of a vLLM wheel, also with `ast`
(tools/wheel_sources.py: pip picks the wheel from the user's configured index, only the files the checks read are
fetched, with HTTP range requests, into the cache, TRL_FORK_CACHE else ~/.cache/trl-fork; nothing of vLLM is
imported or run). The client is the one of the `trl` this Python has (the line's tree with the line's venv).

The `vllm` extra of TRL 1.16.0 allows 0.22.0 to 0.31.0. The tests check both ends and the releases on either side of
each switch of the client, that each switch sits exactly where the releases change, and that a client changed in one
place (a route, a key, a keyword, a switch) fails the check. A stand-in server for tests
(lines/1.16.0/tests/vllm_standin.py) is checked against the client and the releases. The tests that read wheels are
marked slow and build (network, or the cache); lines/1.16.0/docs/vllm_contract.md has the table for every release.
Reproduce it with

    lines/1.16.0/.venv/bin/python lines/1.16.0/tests/build/test_vllm_contract.py --entries 0.22.0 0.22.1 0.23.0 ...
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Callable, ClassVar

import pytest
from packaging.requirements import Requirement
from packaging.version import Version


ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools"))
import wheel_sources  # noqa: E402
from wheel_sources import Sources, assigns_self, mentions, method, parameters, top_level  # noqa: E402


# What the tests unpack from a wheel (0.5-0.7 MB of a 260-320 MB wheel, plus its directory): the server's routers and request models
# (all of vllm/entrypoints/: the routers moved between releases), the weight-transfer engines, the trainer's
# communicator and vllm.config (VllmConfig, which /server_info returns).
UNPACKED = re.compile(
    r"^vllm/__init__\.py$"
    r"|^vllm/entrypoints/.+\.py$"
    r"|^vllm/distributed/weight_transfer/[^/]+\.py$"
    r"|^vllm/distributed/(utils|device_communicators/pynccl)\.py$"
    r"|^vllm/utils/(__init__|network_utils)\.py$"
    r"|^vllm/config/[^/]+\.py$"
)
CACHE = "vllm-contract-1.16.0"
# Both ends of the `vllm` extra, and the last release before each switch of the client with the first one after it.
TESTED_RELEASES = ("0.22.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.31.0")
BACKEND = "nccl"  # --weight-transfer-config '{"backend": "nccl"}'
# The engine attribute that parses each dict the client sends under this key (WeightTransferEngine.parse_*_info).
INFO_CLASSES = {"init_info": "init_info_cls", "update_info": "update_info_cls"}
# The client methods of the weight sync and of text generation: the routes a stand-in server has to serve.
WEIGHT_SYNC_METHODS = (
    "__init__",
    "check_server",
    "get_server_info",
    "get_world_size",
    "init_communicator",
    "_start_weight_update",
    "update_named_params",
    "_finish_weight_update",
    "reset_prefix_cache",
    "generate",
)


def fetch_sources(requirement: str) -> tuple[str, Path]:
    """(version, folder holding its vllm/ sources) of the wheel pip picks for `requirement`; cached."""
    return wheel_sources.fetch_sources(requirement, UNPACKED, CACHE)


# ------------------------------------------------------------------------------------------- the client's side

Cond = frozenset  # of (switch, bool): every switch must have that value (True: vLLM >= the switch's version)


def _call_name(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


@dataclass
class Sent:
    """A dict the client sends: each key with the condition it is sent under, and the dicts sent as values."""

    keys: dict[str, Cond] = field(default_factory=dict)
    nested: dict[str, Sent] = field(default_factory=dict)

    def add(self, key: str, cond: Cond) -> None:
        self.keys[key] = min(self.keys.get(key, cond), cond, key=len)  # sent unconditionally wins


@dataclass(frozen=True)
class Request:
    caller: str  # the client method
    http: str
    path: str
    json: Sent | None  # None: no JSON body
    params: tuple[tuple[str, object], ...]  # query parameters, (name, constant value)
    parses_json: bool  # the client reads the answer as JSON
    cond: Cond


@dataclass(frozen=True)
class VllmCall:
    caller: str
    module: str  # where the client imports the name from
    name: str
    attr: str | None  # NCCLWeightTransferEngine.trainer_init: name NCCLWeightTransferEngine, attr trainer_init
    args: tuple[str, ...]  # the positional arguments, as written
    keywords: tuple[str, ...]
    dict_args: tuple[Sent | None, ...]  # for each positional argument: the dict the client built, if it is one
    cond: Cond
    communicator: bool  # the result becomes self.communicator

    @property
    def text(self) -> str:
        args = ", ".join([*self.args, *(f"{k}=" for k in self.keywords)])
        return f"{self.name}{'.' + self.attr if self.attr else ''}({args})"


class Client:
    """What `VLLMClient` uses of vLLM, read from its source."""

    def __init__(self, path: Path):
        self.path = path
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.switches: dict[str, str] = {}  # module flag -> the vLLM version from which it is True
        self.imports: dict[str, tuple[str, str, Cond]] = {}  # local name -> (module, name, condition)
        self._module(tree.body, Cond())
        self.requests: list[Request] = []
        self.calls: list[VllmCall] = []
        self.group_attributes: list[str] = []  # set on self.communicator.group
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VLLMClient")
        for func in cls.body:
            if isinstance(func, ast.FunctionDef):
                _MethodReader(self, func).statements(func.body, Cond())

    def _flag(self, test: ast.AST) -> tuple[str, bool] | None:
        if isinstance(test, ast.Name) and test.id in self.switches:
            return test.id, True
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and (flag := self._flag(test.operand)):
            return flag[0], not flag[1]
        return None

    def _module(self, body: list[ast.stmt], cond: Cond) -> None:
        for stmt in body:
            value = getattr(stmt, "value", None)
            if isinstance(stmt, ast.Assign) and _call_name(value) == "is_vllm_available" and value.keywords:
                self.switches[stmt.targets[0].id] = value.keywords[0].value.value
            elif isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "vllm":
                for alias in stmt.names:
                    self.imports[alias.asname or alias.name] = (stmt.module, alias.name, cond)
            elif isinstance(stmt, ast.If):
                flag = self._flag(stmt.test)
                self._module(stmt.body, cond | {flag} if flag else cond)
                if flag:
                    self._module(stmt.orelse, cond | {(flag[0], not flag[1])})
                elif _call_name(stmt.test) != "is_vllm_available":  # the else of that one runs without vLLM
                    self._module(stmt.orelse, cond)

    def holds(self, cond: Cond, version: str) -> bool:
        return all((Version(version) >= Version(self.switches[flag])) == value for flag, value in cond)

    def describe(self, cond: Cond) -> str:
        return ", ".join(f"{'from' if v else 'before'} {self.switches[f]}" for f, v in sorted(cond))

    def keys(self, sent: Sent, version: str) -> set[str]:
        return {key for key, cond in sent.keys.items() if self.holds(cond, version)}

    def routes(self, methods=None) -> set[tuple[str, str]]:
        return {(r.http, r.path) for r in self.requests if methods is None or r.caller in methods}


class _MethodReader:
    """Walks one client method (nested functions included) in order, with the switches each statement runs under."""

    HTTP: ClassVar = {"_get": "GET", "get": "GET", "_post": "POST", "post": "POST"}

    def __init__(self, client: Client, func: ast.FunctionDef):
        self.client, self.func = client, func
        self.dicts: dict[str, Sent] = {}
        self.urls: dict[str, ast.JoinedStr] = {}
        # names whose value is read as JSON in this method (`response.json()`)
        self.json_read = {
            n.func.value.id
            for n in ast.walk(func)
            if isinstance(n, ast.Call) and _call_name(n) == "json" and isinstance(n.func.value, ast.Name)
        }

    def statements(self, body: list[ast.stmt], cond: Cond) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                self.expressions(stmt.test, cond, stmt)
                flag = self.client._flag(stmt.test)
                if flag is None and isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.And):
                    # `switch and <a runtime condition>`: the body runs under the switch, the else under either
                    flags = [found for value in stmt.test.values if (found := self.client._flag(value))]
                    self.statements(stmt.body, cond | set(flags))
                    self.statements(stmt.orelse, cond)
                    continue
                self.statements(stmt.body, cond | {flag} if flag else cond)
                self.statements(stmt.orelse, cond | {(flag[0], not flag[1])} if flag else cond)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.statements(stmt.body, cond)
            elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
                for header in (getattr(stmt, "iter", None), getattr(stmt, "test", None), *getattr(stmt, "items", [])):
                    if header is not None:
                        self.expressions(header, cond, stmt)
                for block in (stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])):
                    self.statements(block, cond)
                for handler in getattr(stmt, "handlers", []):
                    self.statements(handler.body, cond)
            else:
                self.simple(stmt, cond)

    def simple(self, stmt: ast.stmt, cond: Cond) -> None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                self.dicts[target.id] = self.sent(value, cond)
            elif isinstance(target, ast.Name) and isinstance(value, ast.JoinedStr):
                self.urls[target.id] = value
            elif isinstance(target, ast.Subscript) and getattr(target.value, "id", None) in self.dicts:
                sent, key = self.dicts[target.value.id], target.slice
                if isinstance(key, ast.Constant):
                    sent.add(key.value, cond)
                    if getattr(value, "id", None) in self.dicts:
                        sent.nested[key.value] = self.dicts[value.id]
            elif isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self.communicator.group":
                self.client.group_attributes.append(target.attr)
        self.expressions(stmt, cond, stmt)

    def sent(self, node: ast.Dict, cond: Cond) -> Sent:
        sent = Sent()
        for key, value in zip(node.keys, node.values):
            if key is None and getattr(value, "id", None) in self.dicts:  # **other
                other = self.dicts[value.id]
                for name, other_cond in other.keys.items():
                    sent.add(name, other_cond | cond)
                sent.nested.update(other.nested)
            elif isinstance(key, ast.Constant):
                sent.add(key.value, cond)
                if getattr(value, "id", None) in self.dicts:
                    sent.nested[key.value] = self.dicts[value.id]
        return sent

    def expressions(self, node: ast.AST, cond: Cond, stmt: ast.stmt) -> None:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            self.request(call, cond, stmt)
            self.vllm_call(call, cond, stmt)

    def _path(self, node: ast.AST) -> str | None:
        url = self.urls.get(node.id) if isinstance(node, ast.Name) else node
        if not isinstance(url, ast.JoinedStr) or len(url.values) < 2:
            return None
        base, *rest = url.values
        if not (isinstance(base, ast.FormattedValue) and ast.unparse(base.value) == "self.base_url"):
            return None
        return "".join(v.value for v in rest) if all(isinstance(v, ast.Constant) for v in rest) else None

    def request(self, call: ast.Call, cond: Cond, stmt: ast.stmt) -> None:
        path = next((p for a in call.args if (p := self._path(a))), None)
        if path is None:
            return
        name = _call_name(call)
        if name in ("_request", "request"):
            http = call.args[0].value
        else:
            if name not in self.HTTP:  # sent through a helper: _Request(self._post, url, ...), pool.submit(...)
                name = _call_name(call.args[0])
            if name not in self.HTTP:
                raise ValueError(f"{self.func.name}: which HTTP method does {ast.unparse(call)} use?")
            http = self.HTTP[name]
        kwargs = {k.arg: k.value for k in call.keywords}
        body = kwargs.get("json")
        json = self.sent(body, cond) if isinstance(body, ast.Dict) else self.dicts.get(getattr(body, "id", None))
        if body is not None and json is None:
            raise ValueError(f"{self.func.name}: cannot read the JSON body of {http} {path}")
        params = kwargs.get("params")
        params = tuple(ast.literal_eval(params).items()) if params is not None else ()
        assigned = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        parses = name in ("_get", "_post") or getattr(assigned, "id", None) in self.json_read
        self.client.requests.append(Request(self.func.name, http, path, json, params, parses, cond))

    def vllm_call(self, call: ast.Call, cond: Cond, stmt: ast.stmt) -> None:
        func, attr = call.func, None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            func, attr = func.value, func.attr
        if not isinstance(func, ast.Name) or func.id not in self.client.imports:
            return
        module, name, import_cond = self.client.imports[func.id]
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        self.client.calls.append(
            VllmCall(
                caller=self.func.name,
                module=module,
                name=name,
                attr=attr,
                args=tuple(ast.unparse(a) for a in call.args),
                keywords=tuple(k.arg for k in call.keywords),
                dict_args=tuple(self.dicts.get(getattr(a, "id", None)) for a in call.args),
                cond=cond | import_cond,
                communicator=target is not None and ast.unparse(target) == "self.communicator",
            )
        )


def client_path() -> Path:
    """trl/generation/vllm_client.py of the `trl` this Python has, found without importing trl."""
    spec = importlib.util.find_spec("trl")
    path = Path(spec.submodule_search_locations[0]) / "generation" / "vllm_client.py" if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"no TRL 1.16.0 line here ({spec.origin if spec else 'no trl'}): use its venv")
    return path


def vllm_extra() -> tuple[str, str]:
    """(lowest, highest) vLLM release the `vllm` extra of the installed trl allows: `vllm>=X,<=Y`."""
    for line in importlib.metadata.requires("trl") or []:
        requirement = Requirement(line)
        if requirement.name == "vllm":
            bounds = {s.operator: s.version for s in requirement.specifier}
            return bounds[">="], bounds["<="]
    raise AssertionError("the installed trl has no vllm extra")


# ---------------------------------------------------------------------------------------------- the server's side


def _literals(node: ast.AST | None) -> set:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)} if node is not None else set()


NOT_JSON = {"Response", "PlainTextResponse", "HTMLResponse", "StreamingResponse", "FileResponse", "RedirectResponse"}


@dataclass
class Handler:
    """What a route's handler reads from a request."""

    module: str
    func: ast.AsyncFunctionDef | ast.FunctionDef
    reads_json: bool = False  # `await request.json()`
    keys: dict[str, bool] = field(default_factory=dict)  # body keys it reads -> required
    model: tuple[str, ast.ClassDef] | None = None  # a pydantic body model
    query: dict[str, set] = field(default_factory=dict)  # query parameter -> its Literal values (empty: any)

    def answers_json(self) -> bool:
        """Some `return` gives what FastAPI sends as JSON: anything but a response class of another kind."""
        returned = [n.value for n in ast.walk(self.func) if isinstance(n, ast.Return) and n.value is not None]
        return any(_call_name(v) not in NOT_JSON if isinstance(v, ast.Call) else True for v in returned)


class VllmSources(Sources):
    """One vLLM release's unpacked sources, with what the contract looks up in them."""

    def class_fields(self, dotted: str, cls: ast.ClassDef, _depth: int = 0) -> dict[str, bool]:
        """{field: required} of a dataclass / pydantic model, inherited ones included (not ClassVars nor `_: KW_ONLY`)."""
        result = {}
        for base in cls.bases if _depth < 8 else ():
            base = base.value if isinstance(base, ast.Subscript) else base
            found = self.definition(dotted, base.id) if isinstance(base, ast.Name) else None
            if found and isinstance(found[1], ast.ClassDef):
                result.update(self.class_fields(*found, _depth + 1))
        for node in cls.body:
            named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            if named and not mentions(node.annotation, "ClassVar") and not mentions(node.annotation, "KW_ONLY"):
                result[node.target.id] = node.value is None
        return result

    def member(self, dotted: str, cls: ast.ClassDef, name: str, _depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, node) of a class attribute or method, looked up in the class and then its bases."""
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return dotted, node
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                return dotted, node
        for base in cls.bases if _depth < 8 else ():
            base = base.value if isinstance(base, ast.Subscript) else base
            found = self.definition(dotted, base.id) if isinstance(base, ast.Name) else None
            if found and isinstance(found[1], ast.ClassDef) and (hit := self.member(*found, name, _depth + 1)):
                return hit
        return None

    @cached_property
    def routes(self) -> dict[tuple[str, str], list[tuple[str, ast.FunctionDef]]]:
        """{(method, path): [(module, handler)]} of every route declared on an APIRouter under vllm/entrypoints."""
        found = {}
        for dotted in self.walk("vllm.entrypoints"):
            if "APIRouter" not in self._path(dotted).read_text(encoding="utf-8"):
                continue  # (parsing every module would take seconds)
            module = self.module(dotted)
            routers = {
                t.id
                for n in top_level(module)
                if isinstance(n, ast.Assign) and _call_name(n.value) == "APIRouter"
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            for node in top_level(module):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for dec in node.decorator_list:
                    func = getattr(dec, "func", None)
                    if not (isinstance(func, ast.Attribute) and getattr(func.value, "id", None) in routers):
                        continue
                    if not (dec.args and isinstance(dec.args[0], ast.Constant)):
                        continue
                    methods = {func.attr.upper()} if func.attr in ("get", "post", "put", "delete", "patch") else set()
                    for keyword in dec.keywords:
                        if keyword.arg == "methods":
                            methods |= {m.upper() for m in _literals(keyword.value)}
                    for http in methods:
                        found.setdefault((http, dec.args[0].value), []).append((dotted, node))
        return found

    def handler(self, http: str, path: str) -> Handler | None:
        hits = self.routes.get((http, path), [])
        if not hits:
            return None
        dotted, func = hits[0]
        handler = Handler(dotted, func)
        # the names bound to the JSON body (`body = await raw_request.json()`), and the keys read from them
        json_names = {
            t.id
            for n in ast.walk(func)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Await) and _call_name(n.value.value) == "json"
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        handler.reads_json = bool(json_names)
        for node in ast.walk(func):
            read_from = getattr(getattr(node, "func", node), "value", None)  # body.get(...) / body[...]
            if getattr(read_from, "id", None) not in json_names:
                continue
            if (
                isinstance(node, ast.Call)
                and _call_name(node) == "get"
                and isinstance(next(iter(node.args), None), ast.Constant)
            ):
                required = len(node.args) == 1 and not node.keywords  # body.get("key"), then checked for None
                handler.keys[node.args[0].value] = handler.keys.get(node.args[0].value, False) or required
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                handler.keys[node.slice.value] = True
        args = func.args
        positional = args.posonlyargs + args.args
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        for arg, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
            annotation = arg.annotation
            if annotation is None or mentions(annotation, "Request"):
                continue
            if mentions(annotation, "Body") or mentions(default, "Body"):
                handler.keys[arg.arg] = default is None
                continue
            if isinstance(annotation, ast.Name):
                model = self.definition(dotted, annotation.id)
                if model and isinstance(model[1], ast.ClassDef):
                    handler.model = model
                    continue
            literal = next((n for n in ast.walk(annotation) if _call_name(getattr(n, "value", n)) == "Literal"), None)
            handler.query[arg.arg] = _literals(literal.slice) if isinstance(literal, ast.Subscript) else set()
        return handler

    def group_class(self, call: VllmCall) -> tuple[str, ast.ClassDef] | str:
        """(module, class) of the .group of the communicator `call` returns (its annotation), or why not found."""
        resolved = _resolve_call(self, call)
        if isinstance(resolved, str):
            return resolved
        dotted, func, _ = resolved
        returned = func.returns.value if isinstance(func.returns, ast.Constant) else getattr(func.returns, "id", None)
        found = self.definition(dotted, returned) if returned else None
        if not found or not isinstance(found[1], ast.ClassDef):
            return f"{func.name} returns {returned or 'an unannotated value'}, not a vLLM class"
        where, communicator = found
        init = method(communicator, "__init__")
        group = next((a for a in init.args.args if a.arg == "group"), None) if init else None
        if group is None or not assigns_self(communicator, "group"):
            return f"{communicator.name} has no .group"
        for name in sorted({n.id for n in ast.walk(group.annotation or ast.Pass()) if isinstance(n, ast.Name)}):
            hit = self.definition(where, name)
            if hit and isinstance(hit[1], ast.ClassDef):
                return hit
        return f"{communicator.name}(group=...) takes no vLLM class"

    def find_class(self, package: str, name: str) -> tuple[str, ast.ClassDef] | None:
        for dotted in self.walk(package):
            if cls := self.cls(dotted, name):
                return dotted, cls
        return None

    @cached_property
    def engine(self) -> tuple[str, ast.ClassDef] | None:
        """(module, class) of the weight-transfer engine the server builds for --weight-transfer-config BACKEND."""
        factory = "vllm.distributed.weight_transfer.factory"
        for node in ast.walk(self.module(factory) or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.Call) and _call_name(node) == "register_engine" and len(node.args) >= 2:
                if not (isinstance(node.args[0], ast.Constant) and node.args[0].value == BACKEND):
                    continue
                if len(node.args) >= 3:  # register_engine(name, module_path, class_name)
                    found = self.definition(node.args[1].value, node.args[2].value)
                else:  # register_engine(name, engine_cls)
                    found = self.definition(factory, node.args[1].id)
                return found if found and isinstance(found[1], ast.ClassDef) else None
        return None

    def info_class(self, attribute: str) -> tuple[str, ast.ClassDef] | str:
        """(module, dataclass) the engine builds from a dict the client sends (`<attribute>(**the dict)`), or why not."""
        if self.engine is None:
            return f"no weight-transfer engine registered as {BACKEND!r}"
        dotted, engine = self.engine
        parse = f"parse_{attribute.removesuffix('_cls')}"
        parser = self.member(dotted, engine, parse)
        if parser is None or not mentions(parser[1], attribute):
            return f"{engine.name}.{parse} does not build {attribute}"
        assigned = self.member(dotted, engine, attribute)
        if assigned is None or not isinstance(assigned[1], ast.Assign) or not isinstance(assigned[1].value, ast.Name):
            return f"{engine.name} sets no {attribute}"
        found = self.definition(assigned[0], assigned[1].value.id)
        if not found or not isinstance(found[1], ast.ClassDef):
            return f"{engine.name}.{attribute} = {assigned[1].value.id}, not found"
        return found


@cache
def sources(root: Path) -> VllmSources:
    """The sources at `root`, parsed once."""
    src = VllmSources(root)
    if src.module("vllm") is None:
        raise FileNotFoundError(f"no vllm/__init__.py under {root}")
    return src


# ---------------------------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class Entry:
    name: str  # what the client relies on
    cond: Cond  # the vLLM versions it applies to (the client's switches)
    check: Callable[[VllmSources, str], str | None]  # (sources, version) -> None when kept, else what is missing


def _signature_problem(func: ast.FunctionDef, positional: int, keywords: tuple[str, ...], skip_first: bool) -> str:
    args = func.args
    names, has_kwargs = parameters(func)
    positional_names = [a.arg for a in args.posonlyargs + args.args][1 if skip_first else 0 :]
    with_default = {
        a.arg for a in (args.posonlyargs + args.args)[len(args.posonlyargs + args.args) - len(args.defaults) :]
    }
    with_default |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    problems = []
    if positional > len(positional_names) and args.vararg is None:
        problems.append(f"takes {len(positional_names)} positional arguments, not {positional}")
    unknown = [k for k in keywords if k not in names and not has_kwargs]
    if unknown:
        problems.append(f"has no parameter {', '.join(unknown)}")
    given = set(positional_names[:positional]) | set(keywords)
    required = [n for n in names[1 if skip_first else 0 :] if n not in with_default and n not in given]
    if required:
        problems.append(f"requires {', '.join(required)}")
    return "; ".join(problems)


def _resolve_call(src: VllmSources, call: VllmCall) -> tuple[str, ast.AST, bool] | str:
    """(module, FunctionDef or ClassDef called, whether its first parameter is bound) or why it is missing."""
    found = src.definition(call.module, call.name)
    if found is None:
        return f"no {call.module}.{call.name}"
    dotted, node = found
    if call.attr is None:
        return dotted, node, False
    if not isinstance(node, ast.ClassDef):
        return f"{call.name} is not a class"
    member = src.member(dotted, node, call.attr)
    if member is None:
        return f"no {call.name}.{call.attr}"
    where, attr = member
    if isinstance(attr, ast.FunctionDef):
        kinds = {getattr(d, "id", None) for d in attr.decorator_list}
        if not kinds & {"staticmethod", "classmethod"}:
            return f"{call.name}.{call.attr} is not a static method"
        return where, attr, "classmethod" in kinds
    # trainer_init = staticmethod(trainer_init)
    if isinstance(attr.value, ast.Call) and _call_name(attr.value) == "staticmethod" and attr.value.args:
        inner = src.definition(where, attr.value.args[0].id)
        if inner and isinstance(inner[1], ast.FunctionDef):
            return inner[0], inner[1], False
    return f"{call.name}.{call.attr} is not a static method"


def _call_check(client: Client, call: VllmCall):
    def check(src: VllmSources, version: str) -> str | None:
        resolved = _resolve_call(src, call)
        if isinstance(resolved, str):
            return resolved
        dotted, node, skip_first = resolved
        if isinstance(node, ast.ClassDef):  # a dataclass built with keywords
            fields = src.class_fields(dotted, node)
            unknown = [k for k in call.keywords if k not in fields]
            given = set(list(fields)[: len(call.args)]) | set(call.keywords)
            required = [f for f, req in fields.items() if req and f not in given]
            problems = ([f"has no field {', '.join(unknown)}"] if unknown else []) + (
                [f"requires {', '.join(required)}"] if required else []
            )
            return f"{call.name}: {'; '.join(problems)}" if problems else None
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return f"{call.name} is not callable"
        problem = _signature_problem(node, len(call.args), call.keywords, skip_first)
        if problem:
            return f"{call.text}: {node.name} {problem}"
        # a dict argument: the keys the function reads from it must be sent (trainer_init reads init_info[...])
        params = [a.arg for a in node.args.posonlyargs + node.args.args][1 if skip_first else 0 :]
        for param, sent in zip(params, call.dict_args):
            if sent is None:
                continue
            read = {
                n.slice.value
                for n in ast.walk(node)
                if isinstance(n, ast.Subscript)
                and getattr(n.value, "id", None) == param
                and isinstance(n.slice, ast.Constant)
            }
            missing = sorted(read - client.keys(sent, version))
            if missing:
                return f"{node.name} reads {param}[{', '.join(map(repr, missing))}], which the client does not send"
        return None

    return check


# close_communicator lets go of the trainer's side of the rendezvous by setting attributes of communicator.group to
# None: `store` is the TCP store the server's side waits on. `socket` is no attribute of vLLM's StatelessProcessGroup
# in any release read (0.22.0 to 0.33.0, nor 0.8.2): setting it adds one and releases nothing, so it only has to be
# settable.
GROUP_ATTRIBUTES_NOT_NEEDED = ("socket",)


def _communicator_check(client: Client, call: VllmCall):
    """The communicator `call` returns has a .group on which close_communicator can set its attributes."""

    def check(src: VllmSources, version: str) -> str | None:
        found = src.group_class(call)
        if isinstance(found, str):
            return found
        where, cls = found
        keywords = [k for d in cls.decorator_list for k in getattr(d, "keywords", [])]
        frozen = any(k.arg in ("frozen", "slots") and getattr(k.value, "value", False) for k in keywords)
        slots = any(
            getattr(t, "id", None) == "__slots__" for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
        )
        if frozen or slots:
            return f"{cls.name} takes no new attribute"
        attributes = set(src.class_fields(where, cls))
        missing = [a for a in client.group_attributes if a not in attributes and a not in GROUP_ATTRIBUTES_NOT_NEEDED]
        return f"communicator.group ({cls.name}) has no {', '.join(missing)}" if missing else None

    return check


def _request_check(client: Client, request: Request):
    def check(src: VllmSources, version: str) -> str | None:
        handler = src.handler(request.http, request.path)
        if handler is None:
            return f"no {request.http} {request.path}"
        problems = []
        sent = client.keys(request.json, version) if request.json is not None else None
        if handler.model is not None:
            where, model = handler.model
            accepted = src.class_fields(where, model)
            unknown = sorted(k for k in sent or () if k not in accepted)
            if sent is None:
                problems.append(f"takes a {model.name} body, the client sends none")
            elif unknown:
                problems.append(f"{model.name} has no field {', '.join(unknown)}")
        elif sent is None:
            if handler.reads_json:
                problems.append("reads a JSON body, the client sends none")
            required = sorted(k for k, req in handler.keys.items() if req)
            if required:
                problems.append(f"requires body keys {', '.join(required)}")
        else:
            unknown = sorted(k for k in sent if k not in handler.keys)
            missing = sorted(k for k, req in handler.keys.items() if req and k not in sent)
            if unknown:
                problems.append(f"reads no body key {', '.join(unknown)}")
            if missing:
                problems.append(f"requires body keys {', '.join(missing)}")
        for name, value in request.params:
            if name not in handler.query:
                problems.append(f"has no query parameter {name}")
            elif handler.query[name] and value not in handler.query[name]:
                problems.append(f"{name}={value!r} is not one of {sorted(handler.query[name])}")
        if request.parses_json and not handler.answers_json():
            problems.append("answers no JSON")
        return f"{request.http} {request.path} ({handler.module}): {'; '.join(problems)}" if problems else None

    return check


def _info_check(client: Client, key: str, sent: Sent):
    """The dict sent as `key` is turned into the engine's dataclass: it must take every key sent and get all it needs."""

    def check(src: VllmSources, version: str) -> str | None:
        found = src.info_class(INFO_CLASSES[key])
        if isinstance(found, str):
            return found
        dotted, cls = found
        if not any(mentions(d, "dataclass") for d in cls.decorator_list):
            return f"{cls.name} is not a dataclass"
        fields = src.class_fields(dotted, cls)
        keys = client.keys(sent, version)
        unknown, missing = sorted(keys - set(fields)), sorted(f for f, req in fields.items() if req and f not in keys)
        problems = ([f"has no field {', '.join(unknown)}"] if unknown else []) + (
            [f"requires {', '.join(missing)}"] if missing else []
        )
        return f"{cls.name}: {'; '.join(problems)}" if problems else None

    return check


def _default_origin(src: VllmSources, dotted: str, node: ast.AST | None) -> str:
    """Where a default value comes from: a constant's module and name, else the expression."""
    if isinstance(node, ast.Name) and (found := src.definition(dotted, node.id)):
        return f"{found[0]}.{node.id}"
    return ast.unparse(node) if node is not None else "no default"


# The trainer side of a packed transfer: the client's broadcasting call, and its buffer parameters. The server side
# reads them from the dataclass that carries `packed`: packed_buffer_size_bytes, packed_num_buffers.
TRAINER_BUFFERS = {
    "packed_nccl_broadcast_producer": ("buffer_size_bytes", "num_buffers"),
    "NCCLTrainerSendWeightsArgs": ("packed_buffer_size_bytes", "packed_num_buffers"),
}
SERVER_BUFFERS = ("packed_buffer_size_bytes", "packed_num_buffers")


def _buffers_check(client: Client, infos: dict[str, Sent]):
    """The client leaves the packed buffers at their defaults on both sides, so both defaults must be the same."""

    def check(src: VllmSources, version: str) -> str | None:
        carrier = next((k for k, sent in infos.items() if "packed" in client.keys(sent, version)), None)
        if carrier is None:
            return "the client sends `packed` in no dict"
        found = src.info_class(INFO_CLASSES[carrier])
        if isinstance(found, str):
            return found
        server_module, server = found
        server_defaults = {
            n.target.id: n.value
            for n in server.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        calls = [c for c in client.calls if c.name in TRAINER_BUFFERS and client.holds(c.cond, version)]
        if not calls:
            return "the client makes no packed broadcast"
        for call in calls:
            resolved = _resolve_call(src, call)
            if isinstance(resolved, str):
                return resolved
            dotted, node, _ = resolved
            if isinstance(node, ast.ClassDef):
                trainer_defaults = {n.target.id: n.value for n in node.body if isinstance(n, ast.AnnAssign)}
            else:
                args = node.args.args
                trainer_defaults = dict(
                    zip([a.arg for a in args[len(args) - len(node.args.defaults) :]], node.args.defaults)
                )
            for trainer_name, server_name in zip(TRAINER_BUFFERS[call.name], SERVER_BUFFERS):
                trainer = _default_origin(src, dotted, trainer_defaults.get(trainer_name))
                served = _default_origin(src, server_module, server_defaults.get(server_name))
                if trainer != served:
                    return f"{call.name}.{trainer_name} defaults to {trainer}, {server.name}.{server_name} to {served}"
        return None

    return check


def _server_info_check(src: VllmSources, version: str) -> str | None:
    handler = src.handler("GET", "/server_info")
    if handler is None:
        return "no GET /server_info"
    if "vllm_config" not in {k.value for n in ast.walk(handler.func) if isinstance(n, ast.Dict) for k in n.keys if k}:
        return "GET /server_info answers no vllm_config"
    found = src.definition("vllm.config", "VllmConfig")
    if not found or "weight_transfer_config" not in src.class_fields(*found):
        return "VllmConfig has no weight_transfer_config"
    return None


def _world_size_check(src: VllmSources, version: str) -> str | None:
    handler = src.handler("GET", "/get_world_size")
    if handler is None:
        return "no GET /get_world_size"
    keys = {k.value for n in ast.walk(handler.func) if isinstance(n, ast.Dict) for k in n.keys if k}
    return None if "world_size" in keys else "GET /get_world_size answers no world_size"


def _completion_choice_check(src: VllmSources, version: str) -> str | None:
    found = src.find_class("vllm.entrypoints", "CompletionResponseChoice")
    if found is None:
        return "no CompletionResponseChoice"
    missing = [f for f in COMPLETION_CHOICE_FIELDS if f not in src.class_fields(*found)]
    return f"CompletionResponseChoice has no {', '.join(missing)}" if missing else None


# What the client reads from the answers (written here: the client indexes them in several steps).
COMPLETION_CHOICE_FIELDS = ("prompt_token_ids", "token_ids", "logprobs", "prompt_logprobs")
ANSWERS = [
    Entry("GET /server_info answers vllm_config.weight_transfer_config", Cond(), _server_info_check),
    Entry("GET /get_world_size answers world_size", Cond(), _world_size_check),
    Entry(
        f"POST /v1/completions answers choices[i].{', .'.join(COMPLETION_CHOICE_FIELDS)}",
        Cond(),
        _completion_choice_check,
    ),
]


def _body_text(client: Client, sent: Sent | None) -> str:
    if sent is None:
        return ""
    parts = []
    for key, cond in sent.keys.items():
        nested = f"{{{_keys_text(client, sent.nested[key])}}}" if key in sent.nested else ""
        parts.append(f"{key}{nested}" + (f" ({client.describe(cond)})" if cond else ""))
    return " {" + ", ".join(parts) + "}"


def _keys_text(client: Client, sent: Sent) -> str:
    return ", ".join(k + (f" ({client.describe(c)})" if c else "") for k, c in sent.keys.items())


def contract(client: Client) -> list[Entry]:
    """The entries the client relies on, in the order of its source."""
    entries = []
    for module, name, cond in client.imports.values():
        entries.append(Entry(f"from {module} import {name}", cond, _defined(module, name)))
    for call in client.calls:
        entries.append(Entry(f"{call.caller}: {call.text}", call.cond, _call_check(client, call)))
        if call.communicator and client.group_attributes:
            attrs = ", .".join(client.group_attributes)
            entries.append(
                Entry(
                    f"{call.text} returns a communicator with .group.{attrs}",
                    call.cond,
                    _communicator_check(client, call),
                )
            )
    infos = {}
    for request in client.requests:
        params = "".join(f" ?{k}={v}" for k, v in request.params)
        text = f"{request.caller}: {request.http} {request.path}{params}{_body_text(client, request.json)}"
        entries.append(
            Entry(text + (" -> JSON" if request.parses_json else ""), request.cond, _request_check(client, request))
        )
        for key, sent in (request.json.nested if request.json else {}).items():
            if key in INFO_CLASSES and key not in infos:
                infos[key] = sent
                entries.append(
                    Entry(
                        f"{key} {{{_keys_text(client, sent)}}} builds the engine's {INFO_CLASSES[key]}",
                        request.cond,
                        _info_check(client, key, sent),
                    )
                )
    entries.append(
        Entry("packed transfer: the trainer's buffer defaults are the server's", Cond(), _buffers_check(client, infos))
    )
    return entries + ANSWERS


def _defined(module: str, name: str):
    def check(src: VllmSources, version: str) -> str | None:
        if src.module(module) is None:
            return f"no module {module}"
        return None if src.definition(module, name) else f"{module} has no {name}"

    return check


def broken(client: Client, version: str, root: Path) -> dict[str, str]:
    """{entry: what this release lacks} for every entry that applies to `version` and the sources at `root` break."""
    src = sources(root)
    return {
        e.name: reason for e in contract(client) if client.holds(e.cond, version) and (reason := e.check(src, version))
    }


def facts(root: Path) -> dict[str, str]:
    """What differs between releases on the points where the client switches, for the table."""
    src = sources(root)
    packed_in = [
        key
        for key, found in (
            ("init_info", src.info_class("init_info_cls")),
            ("update_info", src.info_class("update_info_cls")),
        )
        if not isinstance(found, str) and "packed" in src.class_fields(*found)
    ]
    reset = src.handler("POST", "/reset_prefix_cache")
    init = src.handler("POST", "/init_weight_transfer_engine")
    nccl_engine = src.cls("vllm.distributed.weight_transfer.nccl_engine", "NCCLWeightTransferEngine")
    statics = [
        name
        for name in ("trainer_init", "trainer_send_weights")
        if nccl_engine and src.member("vllm.distributed.weight_transfer.nccl_engine", nccl_engine, name)
    ]
    return {
        "weight-transfer routes in": init.module.removeprefix("vllm.entrypoints.") if init else "—",
        "`packed` in": ", ".join(packed_in) or "—",
        "/reset_prefix_cache answers": ("JSON" if reset.answers_json() else "empty body") if reset else "—",
        "NCCLWeightTransferEngine statics": ", ".join(statics) or "—",
        "nccl_common.trainer_init": "yes"
        if src.definition("vllm.distributed.weight_transfer.nccl_common", "trainer_init")
        else "no",
    }


# ----------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def client() -> Client:
    return Client(client_path())


@pytest.fixture(scope="module")
def releases() -> dict[str, Path]:
    """{version: sources} of TESTED_RELEASES, fetched three at a time."""
    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(lambda v: fetch_sources(f"vllm=={v}"), TESTED_RELEASES))


def _sent(client: Client, path: str, key: str) -> Sent:
    return next(r.json.nested[key] for r in client.requests if r.path == path)


def _switch(client: Client, cond: Cond) -> str:
    ((flag, _),) = cond
    return client.switches[flag]


def test_the_client_is_read_as_expected(client):
    # what the other tests check is read from the client: a reading that misses something would not check it
    assert client.switches == {"_HAS_STATEFUL_TRAINER_ENGINE": "0.28.0", "_HAS_RESET_PREFIX_CACHE_SUCCESS": "0.26.0"}
    assert [(c.name, c.attr) for c in client.calls] == [
        ("get_ip", None),
        ("trainer_init", None),
        ("NCCLWeightTransferEngine", "trainer_init"),
        ("get_ip", None),  # the gloo group's address (patch 0027: TRL's own engine, not vLLM's)
        ("packed_nccl_broadcast_producer", None),
        ("NCCLWeightTransferEngine", "trainer_send_weights"),
        ("NCCLTrainerSendWeightsArgs", None),
    ]
    assert client.group_attributes == ["store", "socket"]
    init, update = (
        _sent(client, "/init_weight_transfer_engine", "init_info"),
        _sent(client, "/update_weights", "update_info"),
    )
    assert client.keys(init, "0.27.1") == {"master_address", "master_port", "rank_offset", "world_size"}
    assert client.keys(init, "0.28.0") == client.keys(init, "0.27.1") | {"packed"}
    assert client.keys(update, "0.27.1") == {"names", "dtype_names", "shapes", "packed"}
    assert client.keys(update, "0.28.0") == {"names", "dtype_names", "shapes"}
    assert client.routes(WEIGHT_SYNC_METHODS) == {
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("GET", "/server_info"),
        ("GET", "/get_world_size"),
        ("POST", "/init_weight_transfer_engine"),
        ("POST", "/start_weight_update"),
        ("POST", "/update_weights"),
        ("POST", "/finish_weight_update"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/completions"),
    }
    server_info = next(r for r in client.requests if r.path == "/server_info")
    assert server_info.params == (("config_format", "json"),) and server_info.parses_json
    resets = {r.cond: r.parses_json for r in client.requests if r.path == "/reset_prefix_cache"}
    assert resets == {
        Cond({("_HAS_RESET_PREFIX_CACHE_SUCCESS", True)}): True,
        Cond({("_HAS_RESET_PREFIX_CACHE_SUCCESS", False)}): False,
    }


def test_the_tested_releases_span_the_vllm_extra_and_each_switch(client):
    assert (TESTED_RELEASES[0], TESTED_RELEASES[-1]) == vllm_extra()
    for switch in client.switches.values():  # the first release with the switch on, and one before it
        before = TESTED_RELEASES[TESTED_RELEASES.index(switch) - 1]
        assert Version(before) < Version(switch)


@pytest.mark.slow
@pytest.mark.build
def test_every_tested_release_keeps_the_contract(client, releases):
    found = {version: broken(client, version, root) for version, root in releases.items()}
    assert not any(found.values()), found


@pytest.mark.slow
@pytest.mark.build
def test_the_client_switches_where_the_releases_change(client, releases):
    # from each switch on the release has what the client then uses (the contract), and the release before it
    # lacks it: the switches are exact
    packed_from = _switch(client, _sent(client, "/init_weight_transfer_engine", "init_info").keys["packed"])
    reset_from = _switch(client, next(r.cond for r in client.requests if r.path == "/reset_prefix_cache"))
    for version, root in releases.items():
        found = facts(root)
        assert found["`packed` in"] == ("init_info" if Version(version) >= Version(packed_from) else "update_info")
        assert found["/reset_prefix_cache answers"] == (
            "JSON" if Version(version) >= Version(reset_from) else "empty body"
        )


# A client changed in one place, the release on which that breaks the contract, and what it then reports.
MUTATIONS = {
    "route": (
        'base_url}/start_weight_update"',
        'base_url}/start_weights_update"',
        "0.31.0",
        "no POST /start_weights_update",
    ),
    "body": (
        'start_weight_update", control=True, json={})',
        'start_weight_update", control=True)',
        "0.22.0",
        "reads a JSON body",
    ),
    "init key": (  # (the NCCL path's init info; the gloo path's, patch 0027, goes to TRL's own engine)
        '"master_address": get_ip(),\n            "master_port": self.group_port,\n            "rank_offset": 1,\n'
        '            "world_size": world_size,',
        '"master_addr": get_ip(),\n            "master_port": self.group_port,\n            "rank_offset": 1,\n'
        '            "world_size": world_size,',
        "0.22.0",
        "has no field master_addr",
    ),
    "update key": ('"dtype_names": dtype_names', '"dtypes": dtype_names', "0.31.0", "requires dtype_names"),
    "completion key": ('"prompt_logprobs": top', '"prompt_logprobz": top', "0.31.0", "has no field prompt_logprobz"),
    "query": ('{"config_format": "json"}', '{"config_format": "yaml"}', "0.31.0", "'yaml' is not one of"),
    "keyword": ("post_iter_func=lambda", "post_iter_fn=lambda", "0.28.0", "has no parameter post_iter_fn"),
    "import": (
        "nccl_common import trainer_init",
        "nccl_common import trainer_start",
        "0.31.0",
        "has no trainer_start",
    ),
    "stateful switch": ('min_version="0.28.0"', 'min_version="0.27.0"', "0.27.1", "has no field packed"),
    "reset switch": ('min_version="0.26.0"', 'min_version="0.25.0"', "0.25.1", "answers no JSON"),
    "group attribute": ("group.store = None", "group.stor = None", "0.31.0", "has no stor"),
}


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_client_that_breaks_the_contract_fails_it(client, releases, tmp_path, mutation):
    old, new, version, expected = MUTATIONS[mutation]
    source = client.path.read_text(encoding="utf-8")
    assert source.count(old) == 1, old
    (tmp_path / "vllm_client.py").write_text(source.replace(old, new), encoding="utf-8")
    found = broken(Client(tmp_path / "vllm_client.py"), version, releases[version])
    assert any(expected in reason for reason in found.values()), found


# ------------------------------------------------------------------------------------------------ the stand-in


def _standin():
    path = ROOT / "lines" / "1.16.0" / "tests" / "vllm_standin.py"
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist yet")
    spec = importlib.util.spec_from_file_location("vllm_standin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_standin_serves_the_routes_the_client_calls(client):
    served, called = set(_standin().ROUTES), client.routes(WEIGHT_SYNC_METHODS)
    assert served == called, (
        f"only the stand-in: {sorted(served - called)}; only the client: {sorted(called - served)}"
    )


@pytest.mark.slow
@pytest.mark.build
def test_every_tested_release_serves_the_standins_routes_and_keys(client, releases):
    # the stand-in speaks the newest protocol: it takes the keys the client sends from the last switch on, every key
    # the engine requires, and none the engine would reject
    standin = _standin()
    newest = Cond({(flag, True) for flag in client.switches})
    for version, root in releases.items():
        src = sources(root)
        missing = sorted(route for route in standin.ROUTES if not src.handler(*route))
        assert not missing, f"vLLM {version} serves no {missing}"
        if not client.holds(newest, version):
            continue
        for key, accepted in (("init_info", standin.INIT_INFO_KEYS), ("update_info", standin.UPDATE_INFO_KEYS)):
            fields = src.class_fields(*src.info_class(INFO_CLASSES[key]))
            sent = client.keys(
                _sent(client, "/init_weight_transfer_engine" if key == "init_info" else "/update_weights", key),
                version,
            )
            required = {name for name, req in fields.items() if req}
            assert sent | required <= set(accepted) <= set(fields), f"vLLM {version}: {key} fields {sorted(fields)}"


def main(argv: list[str]) -> str:
    """The contract's entries (--entries) and a table row for each release named: docs/vllm_contract.md's tables."""
    client = Client(client_path())
    entries = contract(client)
    ids = {e.name: f"C{i}" for i, e in enumerate(entries, 1)}
    lines = []
    if "--entries" in argv:
        lines += ["| | What the client relies on | vLLM |", "| --- | --- | --- |"]
        lines += [f"| {ids[e.name]} | `{e.name}` | {client.describe(e.cond) or 'all'} |" for e in entries]
    details = []
    for wanted in (a for a in argv if not a.startswith("--")):
        version, root = fetch_sources(f"vllm=={wanted}")
        failures = broken(client, version, root)
        applying = [e for e in entries if client.holds(e.cond, version)]
        row = facts(root)
        if not details:
            header = ["vLLM", "entries kept", "broken", *row]
            lines += ["", "| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
            details.append("")
        kept = f"{len(applying) - len(failures)}/{len(applying)}"
        lines.append(
            "| " + " | ".join([version, kept, ", ".join(ids[n] for n in failures) or "—", *row.values()]) + " |"
        )
        details += [f"- {version} {ids[name]}: {reason}" for name, reason in failures.items()]
    return "\n".join(lines + details) + "\n"


if __name__ == "__main__":
    # lines/1.16.0/.venv/bin/python lines/1.16.0/tests/build/test_vllm_contract.py [--entries] VERSION...
    sys.stdout.write(main(sys.argv[1:]))
