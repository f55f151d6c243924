from tiersim.cli import main

raise SystemExit(main())
