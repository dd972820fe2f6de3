from hotcold.cli import main

raise SystemExit(main())
