from notary.cli import main

raise SystemExit(main())
