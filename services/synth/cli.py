"""`egoline synth`: deterministic synthetic episodes, or the device-made format matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from services.common.output import err, print_json_line

app = typer.Typer()


def _csv(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


@app.command("synth")
def synth(
    episodes: Annotated[int, typer.Option(min=1, help="how many episodes")] = 10,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("episodes"),
    seed: Annotated[int, typer.Option(help="same seed, same episodes")] = 0,
    min_s: Annotated[float, typer.Option(help="shortest duration, seconds")] = 4.0,
    max_s: Annotated[float, typer.Option(help="longest duration, seconds")] = 6.0,
    width: int = 320,
    height: int = 240,
    fps: int = 30,
    codecs: Annotated[
        str, typer.Option(help="comma list cycled over episodes: h264,h265,av1")
    ] = "h264",
    containers: Annotated[str, typer.Option(help="comma list: mp4,mkv")] = "mp4",
    depth: Annotated[bool, typer.Option(help="add a depth stream (multi-stream MKV)")] = False,
    defects: Annotated[str, typer.Option(help="comma list, one per leading episode")] = "",
    realistic: Annotated[
        bool,
        typer.Option(
            help="write the device-made matrix instead (encoder defaults, open GOP, VFR, 10-bit, "
            "audio, RGB-D, two cameras, cut files, IMU at its own rate): docs/formats.md"
        ),
    ] = False,
    cases: Annotated[str, typer.Option(help="with --realistic: comma list of case names")] = "",
    curation: Annotated[
        int,
        typer.Option(
            min=0,
            help="with --realistic: a labelled curation mix of this many episodes instead "
            "(clean, content defects, duplicates; labels.json beside episode.json): "
            "docs/curation.md",
        ),
    ] = 0,
) -> None:
    """Write deterministic synthetic episodes (video + IMU + episode.json)."""
    from rich.progress import track

    from services.synth.writer import Defect, plan_episodes, write_episode

    if realistic or curation:
        from services.synth.realistic import (
            curation_cases,
            realistic_cases,
            with_originals,
            write_case,
        )

        pool = curation_cases(curation, seed) if curation else realistic_cases()
        chosen = with_originals(pool, _csv(cases) or None)
        for case, original in track(chosen, description="synthesize", console=err):
            write_case(case, out, seed=seed, original=original)
        print_json_line(
            {"episodes": len(chosen), "out": str(out), "cases": [c.name for c, _ in chosen]}
        )
        return

    specs = plan_episodes(
        episodes,
        seed=seed,
        duration_s=(min_s, max_s),
        fps=fps,
        width=width,
        height=height,
        codecs=tuple(codecs.split(",")),
        containers=tuple(containers.split(",")),
        depth=depth,
        defects=tuple(Defect(d) for d in defects.split(",") if d),
    )
    for spec in track(specs, description="synthesize", console=err):
        write_episode(spec, out)
    print_json_line({"episodes": len(specs), "out": str(out)})
