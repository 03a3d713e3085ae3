from wavefront.cli import main

main()
