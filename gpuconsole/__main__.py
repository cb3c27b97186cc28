"""Allow `python -m gpuconsole`."""

from gpuconsole.cli import main

raise SystemExit(main())
