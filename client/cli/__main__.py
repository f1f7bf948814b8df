"""``python -m client.cli``: the ``splitmq`` tool."""

from client.cli import main

raise SystemExit(main())
