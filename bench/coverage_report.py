"""bench/coverage.py's report: the headline, the counts per module and mode, and the rows."""

from __future__ import annotations

import collections
import re
from typing import Any

OUTCOMES = ("exact", "warned", "silent", "refused", "crashed", "harness")
FEATURES = ("exact", "differ", "refused", "crashed")  # the features column (hub rows)
SAID_CHARS = 90  # an AssumptionWarning line in the rows: its first characters


def counts(rows: dict[str, dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(r["status"] for r in rows.values())


def _all_rows(res: dict[str, Any], mode: str) -> dict[str, dict[str, Any]]:
    return {**res["timm"].get(mode, {}), **res["hf"].get(mode, {})}


def summary(rows: dict[str, dict[str, Any]]) -> str:
    """``"250 of 340 exact, 3 warned, **2 silent**, ..."`` (silent always, and bold)."""
    c = counts(rows)
    parts = [f"{c['exact']} of {len(rows)} exact"]
    for status in OUTCOMES[1:]:
        if status == "silent":
            parts.append(f"**{c[status]} silent**")
        elif c[status]:
            parts.append(f"{c[status]} {status}")
    return ", ".join(parts)


def feature_counts(res: dict[str, Any]) -> collections.Counter[str]:
    """The features column's outcomes over the timm hub rows that have one."""
    rows = res["timm"].get("hub", {}).values()
    return collections.Counter(r["features"]["status"] for r in rows if "features" in r)


def features_summary(res: dict[str, Any]) -> str:
    """``"features (timm's forward_intermediates): 300 exact, 0 differ, 22 refused"``, or ""."""
    c = feature_counts(res)
    if not c:
        return ""
    parts = [f"{c[s]} {s}" for s in FEATURES if c[s] or s in ("exact", "differ")]
    return "features (timm's forward_intermediates): " + ", ".join(parts)


def headline(res: dict[str, Any]) -> str:
    """The report's first line: silent counts first, then every count, for each mode, then the
    features column."""
    modes = [m for m in res["timm"] if _all_rows(res, m)]
    silent = ", ".join(f"{m} {counts(_all_rows(res, m))['silent']}" for m in modes)
    each = "; ".join(f"{m}: {summary(_all_rows(res, m))}" for m in modes)
    feats = features_summary(res)
    return f"# Coverage: SILENT (loads, wrong numbers, nothing said): {silent}. {each}." + (
        f" {feats[0].upper()}{feats[1:]}." if feats else ""
    )


def reason_counts(rows: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """Refusals grouped by reason (the file path and model-specific numbers taken out)."""

    def key(reason: str) -> str:
        reason = re.sub(r"^\S+ has ", "has ", reason)  # the model's name
        reason = re.sub(r"^[\w.]+: (?=\S)", "NAME: ", reason)  # "vit_pe_...: rotary ..."
        reason = re.sub(r"architectures '\w+'", "architectures 'CLASS'", reason)
        reason = re.sub(r" \([^()]*\.[^()]*\)", "", reason)  # the key that showed it
        if "keys: " in reason:
            reason = reason.split(", ")[0]  # the first key of a list
        return re.sub(r"\b\d+\b", "N", reason)

    c = collections.Counter(key(r["reason"]) for r in rows.values() if r["status"] == "refused")
    return c.most_common()


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _said(r: dict[str, Any]) -> str:
    lines = r.get("warnings") or []
    return "; ".join(_cell(w if len(w) <= SAID_CHARS else w[: SAID_CHARS - 1] + "…") for w in lines)


def _features_cell(r: dict[str, Any]) -> str:
    f = r.get("features")
    if f is None:
        return ""
    if f["status"] != "exact":
        return _cell(f"{f['status']}: {f.get('reason', '')}")
    second = f.get("second")
    size = f"; {second['size'][0]}x{second['size'][1]} too" if isinstance(second, dict) else ""
    return f"exact ({f['own']['settings']} settings{size})"


def row(name: str, module: str, r: dict[str, Any]) -> str:
    mark = {"silent": " (!!)", "crashed": " (!)"}.get(r["status"], "")
    feats = f" {_features_cell(r)} |" if "features" in r else ""
    if "rel_f64" in r:
        sw = ", ".join(f"{k}={v}" for k, v in r.get("switches", {}).items())
        sw = f"heads={r.get('heads')}" + (f", {sw}" if sw else "")
        if r.get("reason"):
            sw = f"{r['reason']}; {sw}"
        return (
            f"| {name} | {module} | {r['status']}{mark} | {r['rel_f64']:.1e} | "
            f"{r['rel_f32']:.1e} | {_cell(sw)} | {_said(r)} |{feats}"
        )
    reason = _cell(r.get("reason", ""))
    return f"| {name} | {module} | {r['status']}{mark} | | | {reason} | {_said(r)} |{feats}"


def _module_table(res: dict[str, Any], mode: str) -> list[str]:
    by_module: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for name, r in res["timm"][mode].items():
        by_module[res["modules"].get(name, "?")][name] = r
    if res["hf"].get(mode):
        by_module["transformers"] = res["hf"][mode]
    lines = [
        "| module | " + " | ".join(OUTCOMES) + " | total |",
        "| --- |" + " ---: |" * (len(OUTCOMES) + 1),
    ]
    total: collections.Counter[str] = collections.Counter()
    for module, rows in by_module.items():
        c = counts(rows)
        total.update(c)
        cells = [f"**{c[o]}**" if o == "silent" and c[o] else str(c[o]) for o in OUTCOMES]
        lines.append(f"| {module} | " + " | ".join(cells) + f" | {len(rows)} |")
    cells = [str(total[o]) for o in OUTCOMES]
    lines.append("| all | " + " | ".join(cells) + f" | {sum(total.values())} |")
    return lines


def _listing(res: dict[str, Any], mode: str, status: str) -> list[str]:
    out = []
    for name, r in _all_rows(res, mode).items():
        if r["status"] != status:
            continue
        module = res["modules"].get(name, "transformers")
        rel = f"rel f64 {r['rel_f64']:.1e}, f32 {r['rel_f32']:.1e}" if "rel_f64" in r else ""
        bits = [b for b in (rel, r.get("reason", "")) if b]
        where = f" (in `{r['where']}`)" if r.get("where") else ""
        out.append(f"- {name} ({module}): {'; '.join(bits)}{where}")
    return out


def _heads_section(res: dict[str, Any]) -> list[str]:
    rows = res["timm"].get("bare", {})
    checks = {n: r["heads_native"] for n, r in rows.items() if "heads_native" in r}
    if not checks:
        return []
    c = collections.Counter(v["result"].split(":")[0] for v in checks.values())
    lines = [
        "### bare: heads at the native width, no hint",
        "",
        "Each entry at its own width and depth 1, its state dict's shapes through "
        "`timm_config` with no `num_heads`: "
        + ", ".join(f"{n} {k}" for k, n in c.most_common())
        + ". A wrong count with no AssumptionWarning naming num_heads makes the row silent.",
        "",
    ]
    wrong = {n: v for n, v in checks.items() if v["result"] in ("silent", "warned")}
    lines += [
        f"- {n}: width {v['width']}, vitkit {v['vitkit']} heads, timm {v['timm']} ({v['result']})"
        for n, v in wrong.items()
    ]
    unknown = {n: v for n, v in checks.items() if v["result"].startswith("unknown")}
    lines += [f"- {n}: {v['result']}" for n, v in unknown.items()]
    return lines + ([""] if wrong or unknown else [])


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    modes = [m for m in res["timm"] if _all_rows(res, m)]
    lines = [
        headline(res),
        "",
        f"`python bench/coverage.py` · timm {meta['timm']}, transformers {meta['transformers']}, "
        f"torch {meta['torch']}; float64, {meta['threads']} thread, {meta.get('seconds', 0):.0f} s."
        " Each timm model: depth 2, a 2x2 patch grid, 10 classes, random weights; widths above "
        "384 scaled to 32 per head (heads and every switch kept). **hub**: timm's `save_for_hf` "
        "folder / `save_pretrained`; **bare**: the state dict alone in `model.safetensors` "
        "(`num_heads` passed only where the width was scaled). exact: max |Δlogits| ≤ 1e-8 x "
        "max |logits| in float64 and ≤ 1e-4 in float32 (warnings allowed); warned: differs, an "
        "AssumptionWarning said; **silent (!!)**: differs, nothing said; refused: a one-line "
        "VitkitError; crashed (!): any other exception; harness: the reference could not be "
        "built.",
        "",
    ]
    for mode in modes:
        rows = _all_rows(res, mode)
        lines += [f"## {mode}: {summary(rows)}", "", *_module_table(res, mode), ""]
        for status, title in (("silent", "silent (!!): the worst bugs"), ("crashed", "crashed")):
            listed = _listing(res, mode, status)
            if listed:
                lines += [f"### {mode}: {title}", "", *listed, ""]
        reasons = reason_counts(rows)
        if reasons:
            lines += [f"### {mode}: refusals by reason", "", "| count | reason |", "| ---: | --- |"]
            lines += [f"| {n} | {_cell(r)} |" for r, n in reasons]
            lines.append("")
        if mode == "bare":
            lines += _heads_section(res)
        if mode == "hub":
            wrong = [
                k
                for k, v in res["timm"]["hub"].items()
                if v.get("heads_hint_ok") is False and v["status"] not in ("refused", "harness")
            ]
            if wrong:
                lines += [
                    "### hub: heads a Hub folder without num_heads would get wrong",
                    "",
                    "These small copies record num_heads (their width is scaled); at the native "
                    "width timm's Hub folders do not, and vitkit's reader of such a folder gives "
                    "other heads: " + ", ".join(wrong),
                    "",
                ]
    lines += _features_section(res)
    for mode in modes:
        feats = mode == "hub" and bool(feature_counts(res))
        lines += [
            f"## {mode}: rows",
            "",
            "| name | module | result | rel f64 | rel f32 | switches / reason | said |"
            + (" features |" if feats else ""),
            "| --- | --- | --- | ---: | ---: | --- | --- |" + (" --- |" if feats else ""),
        ]
        for name, r in _all_rows(res, mode).items():
            cells = row(name, res["modules"].get(name, "transformers"), r)
            if feats and "features" not in r:
                cells += " |"
            lines.append(cells)
        lines.append("")
    return "\n".join(lines)


def _features_section(res: dict[str, Any]) -> list[str]:
    """Per module: the features column's counts, then every row that is not exact."""
    rows = {n: r for n, r in res["timm"].get("hub", {}).items() if "features" in r}
    if not rows:
        return []
    by_module: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, r in rows.items():
        by_module[res["modules"].get(name, "?")][r["features"]["status"]] += 1
    lines = [
        f"## hub: {features_summary(res)}",
        "",
        "Each hub row that loads exactly: vitkit's `forward_intermediates` against timm's on the "
        "same float64 weights (bench/coverage_features.py): block indices None, 1, 2, [0], [-1], "
        "[1, 0], [0, -1] x NCHW / NLC x norm off / on x prefix tokens apart or not, plus "
        "intermediates_only and stop_early (58 settings), and `feature_info`; at the copy's own "
        "size and, where timm's module runs another size (`dynamic_img_size`; NaFlexVit), at a "
        "3x4 patch grid. exact: every tensor within 1e-8 of timm's, relative to its max (RoPE at "
        "the second size 1e-7: timm's dynamic path rounds its float64 angles' sin / cos to "
        "float32). At the second size vitkit resamples E_pos on the fly with the kernel it read "
        "from the timm folder (timm's antialiased bicubic). A row whose checkpoint is refused is "
        "refused here too.",
        "",
        "| module | " + " | ".join(FEATURES) + " | total |",
        "| --- |" + " ---: |" * (len(FEATURES) + 1),
    ]
    for module, c in by_module.items():
        lines.append(
            f"| {module} | " + " | ".join(str(c[s]) for s in FEATURES) + f" | {sum(c.values())} |"
        )
    second = sum(isinstance(r["features"].get("second"), dict) for r in rows.values())
    lines += ["", f"At a second input size too: {second} of {len(rows)} rows.", ""]
    odd = [
        f"- {n}: {r['features']['status']}: {r['features'].get('reason', '')}"
        for n, r in rows.items()
        if r["features"]["status"] not in ("exact", "refused")
    ]
    return lines + (odd + [""] if odd else [])
