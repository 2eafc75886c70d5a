"""Print the set-up commands of README.md, one per line: the first two ```sh blocks of
its '## Set up' section (CI runs them verbatim, in this order)."""
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
section = re.search(r"^## Set up\n(.*?)(?=^## )", text, re.S | re.M)
if section is None:
    sys.exit("README.md has no '## Set up' section")
blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1), re.S | re.M)[:2]
for block in blocks:
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    print(" ".join(lines))
