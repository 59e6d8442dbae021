from edl.cli import main

raise SystemExit(main())
