"""The fenced code blocks of a Markdown file (README.md, docs/**/*.md), for the tests that run them."""

import re


def code_blocks(path, lang):
  """The bodies of the ```` ```lang ```` blocks of the file at ``path``, in order."""
  with open(path, encoding="utf-8") as f:
    return re.findall(rf"^```{lang}\n(.*?)^```", f.read(), flags=re.S | re.M)
