import sys

from gateway.agent.demo import main

sys.exit(main())
