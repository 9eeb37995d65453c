from ister.cli.main import main

main()
