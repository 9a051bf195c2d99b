"""Check a folder against its (engine, method) key table: config keys, weight names, shapes and dtypes.

    from headway.export.check import check_folder
    dims = check_folder("exports/eagle3-vllm", "vllm", "eagle3")   # ExportError naming key and both shapes
    dims = check_folder(folder, "vllm", release=release_for("vllm", "0.32.0"))   # what that range loads

Reads only config.json and the safetensors header; every problem of a folder is named in one error.
EAGLE-3 folders also have their feature-layer ids checked: ascending and unique (the engines capture
in layer order), the two engines' keys naming the same layers, and none SGLang cannot capture.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from headway.export.engine_keys import (
    BOOL,
    CONFIG_FILE,
    EXPORT_BLOCK,
    FLOAT,
    INT64,
    LAYER_IDS,
    WEIGHT_SUFFIXES,
    WEIGHTS_FILE,
    Dims,
    EngineTable,
    ExportError,
    config_value,
    dims_from_config,
    method_of_config,
    table_for,
)
from headway.export.releases import Release, check_release, release_for, release_of_folder
from headway.features import layer_to_hidden_state

# safetensors dtype -> the tables' dtype classes
_DTYPES = {"F64": FLOAT, "F32": FLOAT, "F16": FLOAT, "BF16": FLOAT, "I64": INT64, "BOOL": BOOL}


def weight_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype class) from a safetensors header, without reading the tensors."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            s = f.get_slice(name)
            raw = s.get_dtype()
            out[name] = (tuple(int(x) for x in s.get_shape()), _DTYPES.get(raw, raw.lower()))
    return out


def check_config(table: EngineTable, config: dict, where: str) -> None:
    arch = tuple(config.get("architectures") or ())
    if arch != table.architectures:
        raise ExportError(
            f"{where}: architectures {list(arch)} is not what {table.engine} loads for {table.method} "
            f"({list(table.architectures)})"
        )
    for key, want in table.config_values.items():
        if key not in config:
            raise ExportError(f"{where}: config key {key!r} is missing; {table.engine} needs {want!r}")
        if config[key] != want:
            raise ExportError(
                f"{where}: config key {key!r} is {config[key]!r}, {table.engine} needs {want!r}"
            )
    for key in table.config_required:
        config_value(config, key, where)
    for key in table.config_forbidden:
        if config.get(key):
            raise ExportError(
                f"{where}: config key {key!r} is {config[key]!r}; the {table.engine} {table.method} table has no such weights"
            )
    if table.method == "medusa":
        # vLLM's MedusaConfig renames every top-level key holding "num" and "heads"/"layers".
        for key in config:
            if (
                "num" in key
                and ("heads" in key or "layers" in key)
                and key not in ("num_heads", "num_hidden_layers")
            ):
                raise ExportError(
                    f"{where}: vLLM's MedusaConfig would rename config key {key!r} over num_heads/num_hidden_layers"
                )
    else:
        rope = config.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope and rope["rope_theta"] != config["rope_theta"]:
            raise ExportError(
                f"{where}: rope_theta {config['rope_theta']} disagrees with rope_parameters.rope_theta {rope['rope_theta']}"
            )


def named_layer_ids(config: dict) -> tuple[list[int] | None, list[int] | None]:
    """EAGLE-3 feature layers a config names, as hidden_states indices (headway/features.py):
    (vLLM's top-level ids, SGLang's eagle_config ids plus 1); None where a key is absent."""
    top = config.get(LAYER_IDS) or None
    nested = (config.get("eagle_config") or {}).get(LAYER_IDS) or None
    return (list(top) if top else None), ([layer_to_hidden_state(j) for j in nested] if nested else None)


def check_layer_ids(config: dict, engine: str, where: str) -> None:
    """EAGLE-3's feature-layer ids: the two engines' keys agree, ascending, unique, capturable by `engine`."""
    top, sgl = named_layer_ids(config)
    if top and sgl and top != sgl:
        raise ExportError(
            f"{where}: vLLM reads layers {top} ({LAYER_IDS}), SGLang reads {sgl} (eagle_config.{LAYER_IDS} "
            "plus 1): the folder would draft from other features in one of them"
        )
    mine, other = (top, sgl) if engine == "vllm" else (sgl, top)
    if mine is None and other is not None:
        raise ExportError(
            f"{where}: only the other engine's layer ids are set ({other}); {engine} would read its default layers"
        )
    ids = mine or []
    if ids != sorted(set(ids)):
        raise ExportError(
            f"{where}: feature layer ids {ids} are not ascending and unique; the engines concatenate the "
            "captured states in layer order, so fc would read its inputs permuted"
        )
    L = ((config.get(EXPORT_BLOCK) or {}).get("from") or {}).get("num_target_layers")
    if engine == "sglang" and L is not None and L in ids:
        raise ExportError(
            f"{where}: layer id {L - 1} in eagle_config.{LAYER_IDS} is the last layer's output; SGLang captures "
            f"the input of layer id + 1 and the target has {L} layers, so it is never captured"
        )


def check_weights(
    table: EngineTable,
    dims: Dims,
    have: dict[str, tuple[tuple[int, ...], str]],
    where: str,
    release: Release | None = None,
) -> None:
    """Every expected key present with its shape and dtype, nothing else; all problems in one error."""
    want = table.expected(dims)
    problems = []
    for name, (shape, dtype) in want.items():
        if name not in have:
            problems.append(f"missing key {name!r}: the table expects shape {list(shape)} {dtype}")
            continue
        got_shape, got_dtype = have[name]
        formula = table.entry_of(name).shape
        if got_shape != shape:
            problems.append(
                f"key {name!r}: the table expects shape {list(shape)} ({formula}), the file has {list(got_shape)}"
            )
        if got_dtype != dtype:
            problems.append(f"key {name!r}: the table expects dtype {dtype}, the file has {got_dtype}")
    release = release or release_for(table.engine)
    for name in sorted(set(have) - set(want)):
        problems.append(
            f"unexpected key {name!r} of shape {list(have[name][0])}: in {release.label} a weight name the model "
            f"lacks is {release.unknown_weights}"
        )
    if problems:
        raise ExportError(
            f"{where} does not match the {table.engine} {table.method} key table:\n  " + "\n  ".join(problems)
        )


def read_config(folder: Path) -> dict:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{folder} has no {CONFIG_FILE}")
    return json.loads(path.read_text())


def check_folder(
    folder: str | Path,
    engine: str,
    method: str | None = None,
    expect: Dims | None = None,
    release: Release | None = None,
) -> Dims:
    """Check a folder against the (engine, method) table and what `release` loads (default: the range its
    `headway_export` block names, else the newest checked range that loads it); returns the sizes its
    config declares.

    `method` None: take it from the config's architectures. `expect`: sizes it must declare (export
    passes the source checkpoint's, so a config and weights that agree with each other but not with
    the trained heads are refused too).
    """
    folder = Path(folder)
    config = read_config(folder)
    found = method_of_config(config)
    if found is None:
        raise ExportError(
            f"{folder / CONFIG_FILE}: architectures {config.get('architectures')} (model_type "
            f"{config.get('model_type')!r}) is no Medusa, EAGLE-1 or EAGLE-3 draft config"
        )
    if method is not None and found != method:
        raise ExportError(f"{folder / CONFIG_FILE} declares a {found} draft, not {method}")
    table = table_for(engine, found)
    where = str(folder / CONFIG_FILE)
    check_config(table, config, where)
    dims = dims_from_config(found, config, where)
    release = release or release_of_folder(config, engine, found, dims, where)
    check_release(release, found, dims, where)
    if found == "eagle3":
        check_layer_ids(config, engine, where)
    if expect is not None:
        for f in fields(Dims):
            a, b = getattr(expect, f.name), getattr(dims, f.name)
            if a != b:
                raise ExportError(f"{where} declares {f.name}={b}, the checkpoint has {f.name}={a}")
    stray = sorted(
        p.name for p in folder.iterdir() if p.name != WEIGHTS_FILE and p.name.endswith(WEIGHT_SUFFIXES)
    )
    if stray:
        raise ExportError(
            f"{folder}: weight files besides {WEIGHTS_FILE} ({', '.join(stray)}) would be loaded too"
        )
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise ExportError(f"{folder} has no {WEIGHTS_FILE}")
    check_weights(table, dims, weight_header(weights), str(weights), release)
    return dims
