"""Allow `python -m gpuconsole`."""

from gpuconsole.cli.main import main

raise SystemExit(main())
