"""The lag page in a real browser (Debian's Chromium via Playwright) against the lag service on
the real broker: every watched group is listed, and the chart follows lag as records pile up
on a topic whose group does not consume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from services.common.settings import Settings
from services.lag.monitor import PIPELINE_GROUPS
from services.stack.fleet import Fleet
from tests.fixtures.lag import idle_group, produce, running_lag_service
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.connected

SERIES_JS = """group => {
  const g = document.querySelector(`#lag-chart g.series[data-group="${group}"]`);
  if (!g) return null;
  return {
    last: g.dataset.last === "" ? null : Number(g.dataset.last),
    count: Number(g.dataset.count),
    points: [...g.querySelectorAll("polyline")].map(p => p.getAttribute("points")).join(" "),
  };
}"""


def plotted(page: Page, group: str) -> dict[str, Any]:
    """What the chart draws for `group`: its last value, point count and polyline points
    (empty before the group has a series)."""
    result = page.evaluate(SERIES_JS, group)
    return dict(result) if result else {}


def last_y(points: str) -> float:
    """The SVG y of the newest plotted point (smaller is higher on the chart)."""
    return float(points.split()[-1].split(",")[1])


def test_lag_page_lists_every_group_and_its_chart_follows_lag(
    stack: Settings,
    fleet: Fleet,
    chromium: Browser,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    controlled = idle_group(stack, "lagpage", partitions=2)
    with running_lag_service(tmp_path, [controlled.group]) as service:
        page = chromium.new_page(viewport={"width": 1200, "height": 900})
        page.goto(service.url, timeout=30_000)
        assert page.title() == "egoline lag"
        # every pipeline group is listed, with or without committed offsets
        for group in (*PIPELINE_GROUPS, controlled.group):
            page.wait_for_selector(f'tr.group-row[data-group="{group}"]', timeout=60_000)

        def idle_plotted() -> dict[str, Any]:
            series = plotted(page, controlled.group)
            return series if series.get("count", 0) >= 2 and series["last"] == 0 else {}

        before = wait_for(idle_plotted, 60, "the idle group plotted at lag 0")

        produce(stack, controlled.topic, 30)

        def lag_plotted() -> dict[str, Any]:
            series = plotted(page, controlled.group)
            return series if series.get("last") == 30 else {}

        after = wait_for(lag_plotted, 60, "the chart showing 30 messages of lag")
        assert after["points"] != before["points"]
        assert last_y(after["points"]) < last_y(before["points"])  # the line went up
        row = page.locator(f'tr.group-row[data-group="{controlled.group}"]')
        assert row.locator("td").nth(5).inner_text() == "30"
        partitions = page.locator(f'tr.partition-row[data-group="{controlled.group}"]')
        assert partitions.count() == controlled.partitions
        lags = [int(partitions.nth(i).locator("td").nth(5).inner_text()) for i in range(2)]
        assert sum(lags) == 30

        # a second burst: the line keeps following
        produce(stack, controlled.topic, 20)
        wait_for(
            lambda: plotted(page, controlled.group).get("last") == 50,
            60,
            "the chart showing 50 messages of lag",
        )
        # the seconds view plots the same group from lag seconds
        page.select_option("#metric", "lag_seconds")
        seconds = plotted(page, controlled.group)
        assert seconds["count"] >= 1 and seconds["last"] is not None

        page.select_option("#metric", "lag")
        shot = request.config.getoption("--lag-page-png") or str(tmp_path / "lag-page.png")
        page.screenshot(path=shot, full_page=True)
        page.close()
