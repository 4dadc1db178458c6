import sys

from loopscope.agent.server import main

sys.exit(main())
