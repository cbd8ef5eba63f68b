from evalrun.cli.main import main

main()
