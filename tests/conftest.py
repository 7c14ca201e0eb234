"""Fixtures are plugins: media factories and the real-stack fixture live in tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.media",
    "tests.fixtures.stack",
    "tests.fixtures.proxy",
    "tests.fixtures.reader",
    "tests.fixtures.browser",
]
