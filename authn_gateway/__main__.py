from authn_gateway.cli import main

raise SystemExit(main())
