from opsconsole.cli import main

raise SystemExit(main())
