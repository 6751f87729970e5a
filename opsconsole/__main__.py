from opsconsole import launch_gc

launch_gc.pause()  # before the imports: resumed once the command is known, the console's after its first frame

from opsconsole.cli import main  # noqa: E402

raise SystemExit(main())
