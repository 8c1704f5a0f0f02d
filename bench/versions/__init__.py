"""``python -m bench.versions storm``: one scenario on several HAProxy builds, in one run.

Each HAProxy (Debian 12's 2.6 and Debian's 3.0 / 3.2 builds from
``scripts/haproxy-versions.sh``'s cache, or any ``--haproxy LABEL=PATH``) gets a stack
from the same ``certagent init`` arguments; repeats are interleaved (2.6, 3.0, 3.2,
then again in a rotated order) so that the machine's other load falls on every build
alike, and ratios are taken between builds of the same repeat.
"""
