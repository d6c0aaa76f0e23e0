from dplint.cli import main

raise SystemExit(main())
