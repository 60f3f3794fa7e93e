"""Regenerates the default Search corpus and QA set from the fact tables below (run from anywhere):

    python d3mini/envs/search_data/build.py

Writes corpus.jsonl (wiki-18 format: {"id", "contents": '"Title"\\ntext'}) and facts/train.jsonl +
facts/test.jsonl (FlashRAG format: {"id", "question", "golden_answers"}) next to this file. Every
passage and question is written here in our own words from general knowledge; each question's
answer is stated in its passage. Deterministic: the train/test split is a seeded shuffle.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_FRACTION = 0.2

# ----------------------------------------------------------------------------- countries
# name, capital, continent, where (region phrase), currency, currency aliases, languages (None: no
# official-language question), a distinctive extra sentence, aliases of the country name
COUNTRIES = [
    ("France", "Paris", "Europe", "Western Europe", "euro", [], ["French"], "Paris is also home to the Louvre, the most visited art museum in the world.", []),
    ("Germany", "Berlin", "Europe", "Central Europe", "euro", [], ["German"], "It is the most populous member state of the European Union.", []),
    ("Italy", "Rome", "Europe", "Southern Europe", "euro", [], ["Italian"], "The country surrounds two small independent states, San Marino and Vatican City.", []),
    ("Spain", "Madrid", "Europe", "the Iberian Peninsula of south-western Europe", "euro", [], ["Spanish"], "Its territory also includes the Balearic and Canary Islands.", []),
    ("Portugal", "Lisbon", "Europe", "the west of the Iberian Peninsula in south-western Europe", "euro", [], ["Portuguese"], "It is the westernmost country of mainland Europe.", []),
    ("Netherlands", "Amsterdam", "Europe", "north-western Europe", "euro", [], ["Dutch"], "Although Amsterdam is the constitutional capital, the government sits in The Hague.", ["Holland"]),
    ("Belgium", "Brussels", "Europe", "Western Europe", "euro", [], ["Dutch", "French", "German"], "Brussels hosts the main institutions of the European Union.", []),
    ("Austria", "Vienna", "Europe", "Central Europe", "euro", [], ["German"], "Much of the country lies in the Alps.", []),
    ("Switzerland", "Bern", "Europe", "Central Europe", "Swiss franc", ["franc"], ["German", "French", "Italian", "Romansh"], "Its largest city is Zurich, and Geneva hosts many international organisations.", []),
    ("Poland", "Warsaw", "Europe", "Central Europe", "Polish zloty", ["zloty"], ["Polish"], "Its second city, Krakow, was the royal capital for centuries.", []),
    ("Sweden", "Stockholm", "Europe", "Scandinavia in Northern Europe", "Swedish krona", ["krona"], ["Swedish"], "It is the largest of the Nordic countries by population.", []),
    ("Norway", "Oslo", "Europe", "the west of Scandinavia in Northern Europe", "Norwegian krone", ["krone"], ["Norwegian"], "Its long coastline is cut by deep fjords.", []),
    ("Denmark", "Copenhagen", "Europe", "Northern Europe", "Danish krone", ["krone"], None, "The kingdom also includes Greenland and the Faroe Islands.", []),
    ("Finland", "Helsinki", "Europe", "Northern Europe", "euro", [], ["Finnish", "Swedish"], "It is known as the land of a thousand lakes.", []),
    ("Iceland", "Reykjavik", "Europe", "the North Atlantic Ocean, as an island nation of Northern Europe", "Icelandic krona", ["krona"], ["Icelandic"], "Reykjavik is the northernmost capital of a sovereign state.", []),
    ("Ireland", "Dublin", "Europe", "an island in north-western Europe", "euro", [], ["Irish", "English"], "The country is often called the Emerald Isle.", []),
    ("United Kingdom", "London", "Europe", "north-western Europe", "pound sterling", ["pound", "British pound", "sterling"], None, "It is made up of England, Scotland, Wales and Northern Ireland.", ["UK", "Britain", "Great Britain"]),
    ("Greece", "Athens", "Europe", "south-eastern Europe", "euro", [], ["Greek"], "Ancient Greece is often called the cradle of Western civilisation.", []),
    ("Hungary", "Budapest", "Europe", "Central Europe", "Hungarian forint", ["forint"], ["Hungarian"], "Lake Balaton is the largest lake in Central Europe.", []),
    ("Czech Republic", "Prague", "Europe", "Central Europe", "Czech koruna", ["koruna"], None, "The country is also known by its short name, Czechia.", ["Czechia"]),
    ("Romania", "Bucharest", "Europe", "south-eastern Europe", "Romanian leu", ["leu"], ["Romanian"], "The Carpathian Mountains curve through its centre.", []),
    ("Ukraine", "Kyiv", "Europe", "Eastern Europe", "Ukrainian hryvnia", ["hryvnia"], ["Ukrainian"], "It is the second-largest country in Europe by area, after Russia.", []),
    ("Croatia", "Zagreb", "Europe", "south-eastern Europe on the Adriatic Sea", "euro", [], ["Croatian"], "Croatia adopted the euro in 2023, replacing the kuna.", []),
    ("Serbia", "Belgrade", "Europe", "the Balkan Peninsula of south-eastern Europe", "Serbian dinar", ["dinar"], ["Serbian"], "Belgrade stands where the Sava river meets the Danube.", []),
    ("China", "Beijing", "Asia", "East Asia", "renminbi", ["yuan", "Chinese yuan"], ["Standard Chinese"], "Shanghai is its biggest financial centre.", ["People's Republic of China"]),
    ("Japan", "Tokyo", "Asia", "East Asia, on an archipelago in the Pacific Ocean", "Japanese yen", ["yen"], None, "Its four main islands are Honshu, Hokkaido, Kyushu and Shikoku.", []),
    ("India", "New Delhi", "Asia", "South Asia", "Indian rupee", ["rupee"], ["Hindi", "English"], "It is the most populous country in the world.", []),
    ("South Korea", "Seoul", "Asia", "East Asia, on the southern part of the Korean Peninsula", "South Korean won", ["won"], ["Korean"], "Its second city is the port of Busan.", ["Republic of Korea"]),
    ("Thailand", "Bangkok", "Asia", "Southeast Asia", "Thai baht", ["baht"], ["Thai"], "It is the only Southeast Asian country that was never colonised by a European power.", []),
    ("Vietnam", "Hanoi", "Asia", "Southeast Asia", "Vietnamese dong", ["dong"], ["Vietnamese"], "Its largest city is Ho Chi Minh City, formerly Saigon.", []),
    ("Philippines", "Manila", "Asia", "Southeast Asia, on an archipelago of more than 7,000 islands", "Philippine peso", ["peso"], ["Filipino", "English"], "The largest island is Luzon.", []),
    ("Pakistan", "Islamabad", "Asia", "South Asia", "Pakistani rupee", ["rupee"], ["Urdu", "English"], "Its largest city is the port of Karachi.", []),
    ("Bangladesh", "Dhaka", "Asia", "South Asia, on the delta of the Ganges and Brahmaputra rivers", "Bangladeshi taka", ["taka"], ["Bengali"], "It became independent from Pakistan in 1971.", []),
    ("Nepal", "Kathmandu", "Asia", "South Asia, in the Himalayas", "Nepalese rupee", ["rupee"], ["Nepali"], "Eight of the ten highest mountains on Earth are in or on the border of Nepal.", []),
    ("Iran", "Tehran", "Asia", "Western Asia", "Iranian rial", ["rial"], ["Persian"], "It was historically known as Persia.", ["Persia"]),
    ("Iraq", "Baghdad", "Asia", "Western Asia", "Iraqi dinar", ["dinar"], ["Arabic", "Kurdish"], "Its land between the Tigris and Euphrates rivers was ancient Mesopotamia.", []),
    ("Saudi Arabia", "Riyadh", "Asia", "the Arabian Peninsula in Western Asia", "Saudi riyal", ["riyal"], ["Arabic"], "The holy cities of Mecca and Medina lie in its west.", []),
    ("Malaysia", "Kuala Lumpur", "Asia", "Southeast Asia", "Malaysian ringgit", ["ringgit"], ["Malay"], "Kuala Lumpur is known for the Petronas Twin Towers.", []),
    ("Mongolia", "Ulaanbaatar", "Asia", "East Asia, between Russia and China", "Mongolian tugrik", ["tugrik"], ["Mongolian"], "It is the most sparsely populated sovereign country in the world.", []),
    ("Afghanistan", "Kabul", "Asia", "the crossroads of Central Asia and South Asia", "Afghan afghani", ["afghani"], ["Pashto", "Dari"], "It is a landlocked, mountainous country crossed by the Hindu Kush.", []),
    ("Qatar", "Doha", "Asia", "a small peninsula of the Arabian Peninsula in Western Asia", "Qatari riyal", ["riyal"], ["Arabic"], "It hosted the FIFA World Cup in 2022.", []),
    ("Jordan", "Amman", "Asia", "Western Asia", "Jordanian dinar", ["dinar"], ["Arabic"], "The ancient city of Petra lies in the south of the country.", []),
    ("Egypt", "Cairo", "Africa", "North Africa", "Egyptian pound", ["pound"], ["Arabic"], "The pyramids of Giza stand just outside Cairo.", []),
    ("Nigeria", "Abuja", "Africa", "West Africa", "Nigerian naira", ["naira"], ["English"], "It is the most populous country in Africa, and its largest city is Lagos.", []),
    ("Kenya", "Nairobi", "Africa", "East Africa", "Kenyan shilling", ["shilling"], ["Swahili", "English"], "It takes its name from Mount Kenya, its highest mountain.", []),
    ("Ethiopia", "Addis Ababa", "Africa", "the Horn of Africa", "Ethiopian birr", ["birr"], None, "Addis Ababa is the seat of the African Union.", []),
    ("Morocco", "Rabat", "Africa", "North Africa", "Moroccan dirham", ["dirham"], ["Arabic", "Berber"], "Its largest city is Casablanca.", []),
    ("Ghana", "Accra", "Africa", "West Africa, on the Gulf of Guinea", "Ghanaian cedi", ["cedi"], ["English"], "In 1957 it became the first sub-Saharan African colony to gain independence.", []),
    ("Algeria", "Algiers", "Africa", "North Africa", "Algerian dinar", ["dinar"], ["Arabic", "Berber"], "It is the largest country in Africa by area.", []),
    ("Tanzania", "Dodoma", "Africa", "East Africa", "Tanzanian shilling", ["shilling"], ["Swahili", "English"], "Dodoma is the official capital, while Dar es Salaam is the largest city.", []),
    ("Senegal", "Dakar", "Africa", "West Africa", "West African CFA franc", ["CFA franc"], ["French"], "Dakar lies on the Cape Verde Peninsula, the westernmost point of mainland Africa.", []),
    ("Uganda", "Kampala", "Africa", "East Africa", "Ugandan shilling", ["shilling"], ["English", "Swahili"], "It borders Lake Victoria in the south.", []),
    ("United States", "Washington, D.C.", "North America", "North America", "United States dollar", ["US dollar", "dollar", "U.S. dollar"], None, "It is made up of 50 states and a federal district.", ["USA", "United States of America", "US", "America"]),
    ("Canada", "Ottawa", "North America", "the northern part of North America", "Canadian dollar", ["dollar"], ["English", "French"], "It is the second-largest country in the world by area.", []),
    ("Mexico", "Mexico City", "North America", "the southern part of North America", "Mexican peso", ["peso"], None, "Spanish is spoken by the great majority of its people.", []),
    ("Cuba", "Havana", "North America", "the Caribbean Sea, as an island country of North America", "Cuban peso", ["peso"], ["Spanish"], "It is the largest island in the Caribbean.", []),
    ("Jamaica", "Kingston", "North America", "the Caribbean Sea, as an island country of North America", "Jamaican dollar", ["dollar"], ["English"], "It is the birthplace of reggae music.", []),
    ("Brazil", "Brasilia", "South America", "South America", "Brazilian real", ["real"], ["Portuguese"], "Brasilia was built as a planned city and became the capital in 1960, replacing Rio de Janeiro.", []),
    ("Argentina", "Buenos Aires", "South America", "the southern part of South America", "Argentine peso", ["peso"], None, "It is famous as the home of the tango.", []),
    ("Chile", "Santiago", "South America", "a long, narrow strip along the western coast of South America", "Chilean peso", ["peso"], None, "The Andes run along its entire eastern border.", []),
    ("Peru", "Lima", "South America", "western South America", "Peruvian sol", ["sol"], ["Spanish", "Quechua", "Aymara"], "It was the heartland of the Inca Empire.", []),
    ("Colombia", "Bogota", "South America", "the north-west of South America", "Colombian peso", ["peso"], ["Spanish"], "It is the only South American country with coasts on both the Pacific and the Caribbean.", []),
    ("Venezuela", "Caracas", "South America", "the northern coast of South America", "Venezuelan bolivar", ["bolivar"], ["Spanish"], "It is home to Angel Falls, the highest uninterrupted waterfall in the world.", []),
    ("Ecuador", "Quito", "South America", "north-western South America, on the equator", "United States dollar", ["US dollar", "dollar"], ["Spanish"], "The Galapagos Islands belong to Ecuador.", []),
    ("Uruguay", "Montevideo", "South America", "the south-east of South America", "Uruguayan peso", ["peso"], None, "Uruguay won the first FIFA World Cup, which it hosted in 1930.", []),
    ("Australia", "Canberra", "Oceania", "Oceania", "Australian dollar", ["dollar"], None, "Its largest city is Sydney, and Canberra was purpose-built as a compromise between Sydney and Melbourne.", []),
    ("New Zealand", "Wellington", "Oceania", "Oceania, in the south-western Pacific Ocean", "New Zealand dollar", ["dollar"], None, "Its two main islands are the North Island and the South Island, and English and Maori are both widely used.", []),
    ("Fiji", "Suva", "Oceania", "Oceania, on an archipelago in the South Pacific", "Fijian dollar", ["dollar"], ["English", "Fijian", "Fiji Hindi"], "Suva lies on the island of Viti Levu.", []),
    ("Papua New Guinea", "Port Moresby", "Oceania", "Oceania, on the eastern half of the island of New Guinea", "Papua New Guinean kina", ["kina"], ["English", "Tok Pisin", "Hiri Motu"], "More than 800 languages are spoken in the country.", []),
]

# ----------------------------------------------------------------------------- elements
# name, symbol, atomic number, group phrase, group answers for the group question (None: no
# question), extra sentence, name aliases
ELEMENTS = [
    ("Hydrogen", "H", 1, "a nonmetal", None, "It is the lightest element and the most abundant one in the universe.", []),
    ("Helium", "He", 2, "a noble gas", ["noble gas", "noble gases"], "It was first detected in the spectrum of the Sun and is used to fill balloons.", []),
    ("Lithium", "Li", 3, "an alkali metal", ["alkali metal", "alkali metals"], "It is the lightest metal and is widely used in rechargeable batteries.", []),
    ("Beryllium", "Be", 4, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "Its low density makes it useful for windows in X-ray equipment.", []),
    ("Boron", "B", 5, "a metalloid", None, "It is used to make heat-resistant borosilicate glass.", []),
    ("Carbon", "C", 6, "a nonmetal", None, "It is the basis of organic chemistry, and diamond and graphite are two of its forms.", []),
    ("Nitrogen", "N", 7, "a nonmetal", None, "It makes up about 78 percent of Earth's atmosphere.", []),
    ("Oxygen", "O", 8, "a nonmetal", None, "It makes up about 21 percent of the air and is needed for respiration.", []),
    ("Fluorine", "F", 9, "a halogen", ["halogen", "halogens"], "It is the most reactive of all elements.", []),
    ("Neon", "Ne", 10, "a noble gas", ["noble gas", "noble gases"], "It glows reddish orange in advertising signs.", []),
    ("Sodium", "Na", 11, "an alkali metal", ["alkali metal", "alkali metals"], "Together with chlorine it forms sodium chloride, common table salt.", []),
    ("Magnesium", "Mg", 12, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "It burns with a brilliant white flame.", []),
    ("Aluminium", "Al", 13, "a post-transition metal", None, "It is the most abundant metal in Earth's crust; in American English it is spelled aluminum.", ["aluminum"]),
    ("Silicon", "Si", 14, "a metalloid", None, "It is the main material of computer chips and solar cells.", []),
    ("Phosphorus", "P", 15, "a nonmetal", None, "It was discovered by the alchemist Hennig Brand in 1669.", []),
    ("Sulfur", "S", 16, "a nonmetal", None, "It is a bright yellow solid that has been known since ancient times.", ["sulphur"]),
    ("Chlorine", "Cl", 17, "a halogen", ["halogen", "halogens"], "It is a greenish-yellow gas used to disinfect drinking water and swimming pools.", []),
    ("Argon", "Ar", 18, "a noble gas", ["noble gas", "noble gases"], "It is the most abundant noble gas in Earth's atmosphere.", []),
    ("Potassium", "K", 19, "an alkali metal", ["alkali metal", "alkali metals"], "Its symbol comes from kalium, its name in New Latin.", []),
    ("Calcium", "Ca", 20, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "It is the main mineral of bones and teeth.", []),
    ("Titanium", "Ti", 22, "a transition metal", None, "It is strong, light and resistant to corrosion, and is named after the Titans of Greek mythology.", []),
    ("Chromium", "Cr", 24, "a transition metal", None, "It is used for chrome plating and to make stainless steel.", []),
    ("Manganese", "Mn", 25, "a transition metal", None, "Most of it is used in making steel.", []),
    ("Iron", "Fe", 26, "a transition metal", None, "Its symbol comes from the Latin ferrum; it is the main component of steel and of Earth's core.", []),
    ("Cobalt", "Co", 27, "a transition metal", None, "Its compounds have long been used to give glass and pottery a deep blue colour.", []),
    ("Nickel", "Ni", 28, "a transition metal", None, "It is used in coins and in stainless steel.", []),
    ("Copper", "Cu", 29, "a transition metal", None, "Its symbol comes from the Latin cuprum; it is widely used in electrical wiring.", []),
    ("Zinc", "Zn", 30, "a transition metal", None, "It is used to galvanise steel against rust.", []),
    ("Gallium", "Ga", 31, "a post-transition metal", None, "It melts at about 30 degrees Celsius, so it can melt in a person's hand.", []),
    ("Germanium", "Ge", 32, "a metalloid", None, "Dmitri Mendeleev predicted its existence, calling it eka-silicon.", []),
    ("Arsenic", "As", 33, "a metalloid", None, "It is notorious as a poison.", []),
    ("Selenium", "Se", 34, "a nonmetal", None, "It is named after the Greek word for the Moon.", []),
    ("Bromine", "Br", 35, "a halogen", ["halogen", "halogens"], "It is one of only two elements that are liquid at room temperature, with mercury.", []),
    ("Krypton", "Kr", 36, "a noble gas", ["noble gas", "noble gases"], "It was discovered in 1898 by William Ramsay and Morris Travers.", []),
    ("Rubidium", "Rb", 37, "an alkali metal", ["alkali metal", "alkali metals"], "It reacts violently with water.", []),
    ("Strontium", "Sr", 38, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "Its salts give fireworks a bright red colour.", []),
    ("Zirconium", "Zr", 40, "a transition metal", None, "It is used to clad nuclear fuel rods.", []),
    ("Molybdenum", "Mo", 42, "a transition metal", None, "It is added to steel to make it stronger at high temperatures.", []),
    ("Palladium", "Pd", 46, "a transition metal", None, "It is a precious metal used in catalytic converters.", []),
    ("Silver", "Ag", 47, "a transition metal", None, "Its symbol comes from the Latin argentum; it conducts electricity better than any other element.", []),
    ("Cadmium", "Cd", 48, "a transition metal", None, "It is a toxic metal once common in rechargeable nickel-cadmium batteries.", []),
    ("Tin", "Sn", 50, "a post-transition metal", None, "Its symbol comes from the Latin stannum; bronze is an alloy of copper and tin.", []),
    ("Antimony", "Sb", 51, "a metalloid", None, "Its symbol comes from the Latin stibium.", []),
    ("Iodine", "I", 53, "a halogen", ["halogen", "halogens"], "The thyroid gland needs it to make hormones, and it forms a violet vapour when heated.", []),
    ("Xenon", "Xe", 54, "a noble gas", ["noble gas", "noble gases"], "It is used in bright flash lamps and car headlights.", []),
    ("Caesium", "Cs", 55, "an alkali metal", ["alkali metal", "alkali metals"], "Atomic clocks based on it define the second; it is spelled cesium in American English.", ["cesium"]),
    ("Barium", "Ba", 56, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "Patients swallow barium sulfate so that the gut shows up on X-ray images.", []),
    ("Neodymium", "Nd", 60, "a lanthanide", ["lanthanide", "lanthanides", "rare earth metal", "rare earth"], "It is used to make the strongest permanent magnets.", []),
    ("Tungsten", "W", 74, "a transition metal", None, "It has the highest melting point of all metals, and its symbol comes from its other name, wolfram.", ["wolfram"]),
    ("Platinum", "Pt", 78, "a transition metal", None, "It is a dense precious metal used in jewellery and catalytic converters.", []),
    ("Gold", "Au", 79, "a transition metal", None, "Its symbol comes from the Latin aurum; it does not tarnish.", []),
    ("Mercury", "Hg", 80, "a transition metal", None, "It is the only metal that is liquid at room temperature, and its symbol comes from the Latin hydrargyrum.", ["quicksilver"]),
    ("Lead", "Pb", 82, "a post-transition metal", None, "Its symbol comes from the Latin plumbum.", []),
    ("Bismuth", "Bi", 83, "a post-transition metal", None, "It forms colourful crystals with stepped faces.", []),
    ("Polonium", "Po", 84, "a rare radioactive element", None, "Marie and Pierre Curie discovered it in 1898 and named it after Poland.", []),
    ("Radon", "Rn", 86, "a noble gas", ["noble gas", "noble gases"], "It is a radioactive gas that can build up in basements.", []),
    ("Radium", "Ra", 88, "an alkaline earth metal", ["alkaline earth metal", "alkaline earth metals"], "Marie and Pierre Curie discovered it in 1898.", []),
    ("Uranium", "U", 92, "an actinide", ["actinide", "actinides"], "It was discovered by Martin Heinrich Klaproth in 1789 and is used as nuclear fuel.", []),
    ("Plutonium", "Pu", 94, "an actinide", ["actinide", "actinides"], "It is named after the dwarf planet Pluto and is used in nuclear weapons and reactors.", []),
]
THE_COUNTRIES = {"Netherlands", "United Kingdom", "Czech Republic", "Philippines", "United States"}
LANG_ALIASES = {"Standard Chinese": ["Mandarin", "Mandarin Chinese", "Chinese"], "Persian": ["Farsi"], "Bengali": ["Bangla"],
                "Berber": ["Tamazight", "Amazigh"]}

# symbols that are English stop words (as, be) cannot be looked up by BM25, so they get no reverse question
STOP_SYMBOLS = {"As", "Be"}

# ----------------------------------------------------------------------------- books
# title, kind, author, author aliases, year (None: no year question), main character (None: no
# character question), title aliases, description
BOOKS = [
    ("Pride and Prejudice", "novel", "Jane Austen", ["Austen"], 1813, "Elizabeth Bennet", [], "It follows Elizabeth Bennet and her changing opinion of the proud Mr Darcy."),
    ("Nineteen Eighty-Four", "dystopian novel", "George Orwell", ["Orwell", "Eric Arthur Blair"], 1949, "Winston Smith", ["1984"], "Winston Smith lives under the constant surveillance of Big Brother in the superstate of Oceania."),
    ("Animal Farm", "novella", "George Orwell", ["Orwell"], 1945, None, [], "Farm animals overthrow their human farmer, and the pigs gradually become tyrants themselves."),
    ("Moby-Dick", "novel", "Herman Melville", ["Melville"], 1851, "Captain Ahab", ["Moby Dick"], "The sailor Ishmael narrates Captain Ahab's obsessive hunt for a great white whale."),
    ("War and Peace", "novel", "Leo Tolstoy", ["Tolstoy", "Lev Tolstoy"], None, None, [], "It follows several aristocratic Russian families during Napoleon's invasion of Russia in 1812."),
    ("Anna Karenina", "novel", "Leo Tolstoy", ["Tolstoy", "Lev Tolstoy"], None, "Anna Karenina", [], "It tells of a married aristocrat's affair with the officer Count Vronsky."),
    ("Crime and Punishment", "novel", "Fyodor Dostoevsky", ["Dostoevsky", "Dostoyevsky"], 1866, "Raskolnikov", [], "The poor former student Rodion Raskolnikov commits a murder in Saint Petersburg and struggles with his guilt."),
    ("Don Quixote", "novel", "Miguel de Cervantes", ["Cervantes"], 1605, "Don Quixote", [], "A Spanish nobleman who has read too many tales of chivalry sets out as a knight with his squire Sancho Panza."),
    ("Hamlet", "tragedy", "William Shakespeare", ["Shakespeare"], None, "Prince Hamlet", [], "Prince Hamlet of Denmark seeks revenge on his uncle Claudius, who murdered Hamlet's father to take the throne."),
    ("Romeo and Juliet", "tragedy", "William Shakespeare", ["Shakespeare"], None, None, [], "Two young lovers from feuding families in Verona die tragically."),
    ("The Great Gatsby", "novel", "F. Scott Fitzgerald", ["Scott Fitzgerald", "Fitzgerald", "Francis Scott Fitzgerald"], 1925, "Jay Gatsby", ["Great Gatsby"], "Narrated by Nick Carraway, it portrays the mysterious millionaire Jay Gatsby on Long Island in the Jazz Age."),
    ("To Kill a Mockingbird", "novel", "Harper Lee", ["Lee"], 1960, "Scout Finch", [], "Scout Finch tells of her father, the lawyer Atticus Finch, defending a Black man in a small Alabama town."),
    ("The Catcher in the Rye", "novel", "J. D. Salinger", ["Salinger", "J.D. Salinger", "Jerome David Salinger"], 1951, "Holden Caulfield", ["Catcher in the Rye"], "The teenager Holden Caulfield wanders New York City after being expelled from school."),
    ("One Hundred Years of Solitude", "novel", "Gabriel Garcia Marquez", ["Garcia Marquez", "Gabriel García Márquez"], 1967, None, [], "It chronicles seven generations of the Buendia family in the fictional town of Macondo."),
    ("The Odyssey", "epic poem", "Homer", [], None, "Odysseus", ["Odyssey"], "It follows the Greek hero Odysseus on his ten-year journey home to Ithaca after the Trojan War."),
    ("The Iliad", "epic poem", "Homer", [], None, "Achilles", ["Iliad"], "It is set during the siege of Troy and centres on the anger of the warrior Achilles."),
    ("The Divine Comedy", "narrative poem", "Dante Alighieri", ["Dante"], None, None, ["Divine Comedy"], "It describes a journey through Hell, Purgatory and Paradise, with the poet Virgil as the first guide."),
    ("Frankenstein", "novel", "Mary Shelley", ["Shelley", "Mary Wollstonecraft Shelley"], 1818, "Victor Frankenstein", [], "The young scientist Victor Frankenstein brings a creature to life and then abandons it."),
    ("Dracula", "Gothic horror novel", "Bram Stoker", ["Stoker"], 1897, "Count Dracula", [], "The solicitor Jonathan Harker travels to Transylvania to meet the vampire Count Dracula."),
    ("Jane Eyre", "novel", "Charlotte Bronte", ["Charlotte Brontë", "Bronte"], 1847, "Jane Eyre", [], "An orphaned governess falls in love with her employer, Mr Rochester of Thornfield Hall."),
    ("Wuthering Heights", "novel", "Emily Bronte", ["Emily Brontë", "Bronte"], 1847, "Heathcliff", [], "It tells of the passionate and destructive love between Heathcliff and Catherine Earnshaw on the Yorkshire moors."),
    ("Great Expectations", "novel", "Charles Dickens", ["Dickens"], None, "Pip", [], "The orphan Pip receives a fortune from a secret benefactor and learns who his true friends are."),
    ("Oliver Twist", "novel", "Charles Dickens", ["Dickens"], None, "Oliver Twist", [], "An orphan escapes a workhouse and falls in with a gang of young pickpockets led by Fagin in London."),
    ("A Tale of Two Cities", "novel", "Charles Dickens", ["Dickens"], 1859, "Sydney Carton", [], "Set in London and Paris before and during the French Revolution."),
    ("Les Miserables", "novel", "Victor Hugo", ["Hugo"], 1862, "Jean Valjean", ["Les Misérables"], "The former convict Jean Valjean seeks redemption while the police inspector Javert pursues him."),
    ("The Hunchback of Notre-Dame", "novel", "Victor Hugo", ["Hugo"], 1831, "Quasimodo", ["Hunchback of Notre Dame", "Notre-Dame de Paris"], "The bell-ringer Quasimodo lives in the cathedral of Notre-Dame in Paris."),
    ("Madame Bovary", "novel", "Gustave Flaubert", ["Flaubert"], None, "Emma Bovary", [], "Emma Bovary, a doctor's wife in provincial France, escapes her dull life through affairs and debts."),
    ("The Adventures of Tom Sawyer", "novel", "Mark Twain", ["Twain", "Samuel Clemens", "Samuel Langhorne Clemens"], 1876, "Tom Sawyer", ["Tom Sawyer"], "A mischievous boy grows up along the Mississippi River in the town of St. Petersburg, Missouri."),
    ("Adventures of Huckleberry Finn", "novel", "Mark Twain", ["Twain", "Samuel Clemens", "Samuel Langhorne Clemens"], None, "Huckleberry Finn", ["Huckleberry Finn", "The Adventures of Huckleberry Finn"], "Huck Finn rafts down the Mississippi River with Jim, a man escaping slavery."),
    ("Ulysses", "modernist novel", "James Joyce", ["Joyce"], 1922, "Leopold Bloom", [], "It follows Leopold Bloom through a single day in Dublin, 16 June 1904."),
    ("The Hobbit", "fantasy novel", "J. R. R. Tolkien", ["Tolkien", "J.R.R. Tolkien", "John Ronald Reuel Tolkien"], 1937, "Bilbo Baggins", ["Hobbit"], "Bilbo Baggins joins thirteen dwarves and the wizard Gandalf to win back treasure guarded by the dragon Smaug."),
    ("The Lord of the Rings", "fantasy novel", "J. R. R. Tolkien", ["Tolkien", "J.R.R. Tolkien", "John Ronald Reuel Tolkien"], None, "Frodo Baggins", ["Lord of the Rings"], "The hobbit Frodo Baggins must destroy the One Ring in the fires of Mount Doom."),
    ("Alice's Adventures in Wonderland", "novel", "Lewis Carroll", ["Carroll", "Charles Lutwidge Dodgson"], 1865, "Alice", ["Alice in Wonderland"], "A girl named Alice falls down a rabbit hole into a fantasy world of strange creatures."),
    ("The Old Man and the Sea", "novella", "Ernest Hemingway", ["Hemingway"], 1952, "Santiago", ["Old Man and the Sea"], "The ageing Cuban fisherman Santiago battles a giant marlin far out in the Gulf Stream."),
    ("Brave New World", "dystopian novel", "Aldous Huxley", ["Huxley"], 1932, None, [], "It imagines a future World State where people are engineered in hatcheries and kept content by a drug called soma."),
    ("The Grapes of Wrath", "novel", "John Steinbeck", ["Steinbeck"], 1939, "Tom Joad", ["Grapes of Wrath"], "The Joad family leaves the Oklahoma Dust Bowl for California during the Great Depression."),
    ("Of Mice and Men", "novella", "John Steinbeck", ["Steinbeck"], 1937, None, [], "Two migrant ranch workers, George Milton and Lennie Small, dream of owning land in California."),
    ("Fahrenheit 451", "dystopian novel", "Ray Bradbury", ["Bradbury"], 1953, "Guy Montag", [], "The fireman Guy Montag burns books in a society where they are banned."),
    ("The Metamorphosis", "novella", "Franz Kafka", ["Kafka"], 1915, "Gregor Samsa", ["Metamorphosis"], "The travelling salesman Gregor Samsa wakes up transformed into a huge insect."),
    ("The Trial", "novel", "Franz Kafka", ["Kafka"], 1925, "Josef K.", ["Trial"], "Josef K. is arrested and prosecuted by a remote authority without ever learning his crime."),
    ("The Little Prince", "novella", "Antoine de Saint-Exupery", ["Saint-Exupery", "Antoine de Saint-Exupéry"], 1943, None, ["Little Prince"], "A pilot stranded in the Sahara meets a young prince who has travelled from a tiny asteroid."),
    ("Robinson Crusoe", "novel", "Daniel Defoe", ["Defoe"], 1719, "Robinson Crusoe", [], "A castaway spends 28 years on a remote tropical island."),
    ("Gulliver's Travels", "satirical novel", "Jonathan Swift", ["Swift"], 1726, "Lemuel Gulliver", ["Gullivers Travels"], "The ship's surgeon Lemuel Gulliver visits Lilliput, a land of tiny people, and other strange lands."),
    ("The Picture of Dorian Gray", "novel", "Oscar Wilde", ["Wilde"], 1890, "Dorian Gray", ["Picture of Dorian Gray"], "A young man's portrait ages and shows his sins while he himself stays young and handsome."),
    ("Treasure Island", "adventure novel", "Robert Louis Stevenson", ["Stevenson", "R. L. Stevenson"], 1883, "Jim Hawkins", [], "Young Jim Hawkins sails in search of buried treasure and meets the pirate Long John Silver."),
    ("The Time Machine", "science fiction novella", "H. G. Wells", ["Wells", "H.G. Wells", "Herbert George Wells"], 1895, None, ["Time Machine"], "A Victorian inventor travels to the year 802,701, where he meets the Eloi and the Morlocks."),
    ("The War of the Worlds", "science fiction novel", "H. G. Wells", ["Wells", "H.G. Wells", "Herbert George Wells"], 1898, None, ["War of the Worlds"], "Martians invade southern England in huge fighting machines."),
    ("Twenty Thousand Leagues Under the Seas", "adventure novel", "Jules Verne", ["Verne"], None, "Captain Nemo", ["Twenty Thousand Leagues Under the Sea", "20,000 Leagues Under the Sea"], "Captain Nemo commands the submarine Nautilus."),
    ("Around the World in Eighty Days", "adventure novel", "Jules Verne", ["Verne"], None, "Phileas Fogg", ["Around the World in 80 Days"], "The Englishman Phileas Fogg bets that he can travel around the world in eighty days."),
    ("Mrs Dalloway", "novel", "Virginia Woolf", ["Woolf"], 1925, "Clarissa Dalloway", ["Mrs. Dalloway"], "It follows Clarissa Dalloway through a single day in London as she prepares a party."),
    ("Beloved", "novel", "Toni Morrison", ["Morrison"], 1987, "Sethe", [], "Sethe, a woman who escaped slavery, is haunted in Ohio after the American Civil War."),
    ("Things Fall Apart", "novel", "Chinua Achebe", ["Achebe"], 1958, "Okonkwo", [], "The Igbo leader Okonkwo faces the arrival of colonial rule and Christian missionaries in Nigeria."),
    ("Harry Potter and the Philosopher's Stone", "fantasy novel", "J. K. Rowling", ["Rowling", "J.K. Rowling", "Joanne Rowling"], 1997, "Harry Potter", ["Harry Potter and the Sorcerer's Stone"], "An orphaned boy learns on his eleventh birthday that he is a wizard and goes to Hogwarts School."),
    ("Faust", "tragic play", "Johann Wolfgang von Goethe", ["Goethe"], None, "Faust", [], "A scholar makes a pact with the devil Mephistopheles."),
]

# ----------------------------------------------------------------------------- works of art
# title, artist, artist aliases, year (None: no question), where it is kept (golden answers; None: no question),
# verb, description
ARTWORKS = [
    ("Mona Lisa", "Leonardo da Vinci", ["Leonardo", "da Vinci"], None, ["Louvre", "the Louvre", "Louvre Museum"], "painted", "It is a half-length portrait painted in the early 16th century, famous for the sitter's mysterious smile, and it hangs in the Louvre in Paris."),
    ("The Last Supper", "Leonardo da Vinci", ["Leonardo", "da Vinci"], None, ["Santa Maria delle Grazie"], "painted", "It is a mural of the 1490s on a wall of the convent of Santa Maria delle Grazie in Milan."),
    ("The Starry Night", "Vincent van Gogh", ["van Gogh"], 1889, ["Museum of Modern Art", "MoMA"], "painted", "It shows a swirling night sky over a village and was painted in 1889 at an asylum in Saint-Remy-de-Provence; it is now in the Museum of Modern Art in New York."),
    ("Sunflowers", "Vincent van Gogh", ["van Gogh"], 1888, None, "painted", "It is a series of still lifes of sunflowers in a vase, painted in Arles in 1888."),
    ("Guernica", "Pablo Picasso", ["Picasso"], 1937, ["Museo Reina Sofia", "Reina Sofia"], "painted", "The 1937 painting responds to the bombing of the Basque town of Guernica during the Spanish Civil War and is kept at the Museo Reina Sofia in Madrid."),
    ("The Persistence of Memory", "Salvador Dali", ["Dali", "Salvador Dalí"], 1931, ["Museum of Modern Art", "MoMA"], "painted", "The 1931 surrealist painting shows soft, melting pocket watches and is held by the Museum of Modern Art in New York."),
    ("The Scream", "Edvard Munch", ["Munch"], 1893, None, "painted", "The Norwegian artist made the first version in 1893; it shows an agonised figure against a blood-red sky."),
    ("Girl with a Pearl Earring", "Johannes Vermeer", ["Vermeer", "Jan Vermeer"], None, ["Mauritshuis"], "painted", "It is a Dutch Golden Age study of a girl in a blue and yellow turban, kept at the Mauritshuis in The Hague."),
    ("The Night Watch", "Rembrandt", ["Rembrandt van Rijn"], 1642, ["Rijksmuseum"], "painted", "The huge 1642 group portrait of a civic militia company hangs in the Rijksmuseum in Amsterdam."),
    ("The Birth of Venus", "Sandro Botticelli", ["Botticelli"], None, ["Uffizi", "Uffizi Gallery"], "painted", "It shows the goddess Venus arriving at the shore on a scallop shell, painted in the 1480s, and hangs in the Uffizi Gallery in Florence."),
    ("Sistine Chapel ceiling", "Michelangelo", ["Michelangelo Buonarroti"], None, None, "painted", "Painted between 1508 and 1512 in Vatican City, its scenes from the Book of Genesis include The Creation of Adam."),
    ("David", "Michelangelo", ["Michelangelo Buonarroti"], None, ["Galleria dell'Accademia", "Accademia"], "sculpted", "It is a marble statue of the biblical hero, carved between 1501 and 1504, and stands in the Galleria dell'Accademia in Florence."),
    ("The Kiss", "Gustav Klimt", ["Klimt"], None, ["Belvedere"], "painted", "Painted in 1907 and 1908 with gold leaf, it shows an embracing couple and is in the Belvedere museum in Vienna."),
    ("Water Lilies", "Claude Monet", ["Monet"], None, None, "painted", "It is a series of about 250 paintings of the flower garden at his home in Giverny."),
    ("Impression, Sunrise", "Claude Monet", ["Monet"], 1872, ["Musee Marmottan Monet", "Marmottan"], "painted", "The 1872 view of the harbour of Le Havre gave the Impressionist movement its name; it is in the Musee Marmottan Monet in Paris."),
    ("The Garden of Earthly Delights", "Hieronymus Bosch", ["Bosch"], None, ["Prado", "Prado Museum"], "painted", "It is a triptych full of fantastic figures, kept in the Prado Museum in Madrid."),
    ("Las Meninas", "Diego Velazquez", ["Velazquez", "Diego Velázquez"], 1656, ["Prado", "Prado Museum"], "painted", "The 1656 painting shows the young Spanish princess Margaret Theresa with her maids of honour and is in the Prado Museum in Madrid."),
    ("The Great Wave off Kanagawa", "Hokusai", ["Katsushika Hokusai"], None, None, "made", "It is a Japanese woodblock print from around 1831, part of the series Thirty-six Views of Mount Fuji."),
    ("American Gothic", "Grant Wood", ["Wood"], 1930, ["Art Institute of Chicago"], "painted", "The 1930 painting shows a farmer holding a pitchfork beside a woman in front of a house; it is in the Art Institute of Chicago."),
    ("Nighthawks", "Edward Hopper", ["Hopper"], 1942, ["Art Institute of Chicago"], "painted", "The 1942 painting shows people in a downtown diner late at night and belongs to the Art Institute of Chicago."),
    ("The School of Athens", "Raphael", ["Raffaello Sanzio"], None, None, "painted", "It is a fresco painted between 1509 and 1511 in the Apostolic Palace in the Vatican, showing the philosophers Plato and Aristotle."),
    ("Liberty Leading the People", "Eugene Delacroix", ["Delacroix", "Eugène Delacroix"], 1830, ["Louvre", "the Louvre"], "painted", "It commemorates the July Revolution of 1830 in France and hangs in the Louvre."),
    ("Campbell's Soup Cans", "Andy Warhol", ["Warhol"], 1962, ["Museum of Modern Art", "MoMA"], "made", "The 1962 pop art work consists of 32 canvases, one for each soup flavour, and is in the Museum of Modern Art."),
    ("The Thinker", "Auguste Rodin", ["Rodin"], None, None, "sculpted", "The bronze sculpture of a seated man deep in thought was first conceived as part of The Gates of Hell."),
    ("The Arnolfini Portrait", "Jan van Eyck", ["van Eyck"], 1434, ["National Gallery"], "painted", "The 1434 oil painting of a merchant and his wife with a convex mirror is in the National Gallery in London."),
]

# ----------------------------------------------------------------------------- hand-written passages
# (title, text, [(question, [golden answers])])
PASSAGES = [
    # --- inventions and discoveries
    ("Telephone", "Alexander Graham Bell, a Scottish-born inventor and teacher of the deaf, patented the telephone in 1876. In March of that year he made the first successful call to his assistant, Thomas Watson.",
     [("Who patented the telephone in 1876?", ["Alexander Graham Bell", "Graham Bell", "Bell"]), ("In what year was the telephone patented?", ["1876"]),
      ("Who was Alexander Graham Bell's assistant on the first telephone call?", ["Thomas Watson", "Watson"])]),
    ("World Wide Web", "The English computer scientist Tim Berners-Lee proposed the World Wide Web in 1989 while working at CERN, and he wrote the first web browser and web server in 1990.",
     [("Who invented the World Wide Web?", ["Tim Berners-Lee", "Berners-Lee"]), ("At which research laboratory was the World Wide Web invented?", ["CERN"])]),
    ("Alfred Nobel", "Alfred Nobel was a Swedish chemist and engineer who invented dynamite and patented it in 1867. In his will he left most of his fortune to found the Nobel Prizes.",
     [("Who invented dynamite?", ["Alfred Nobel", "Nobel"]), ("What explosive did Alfred Nobel invent?", ["dynamite"])]),
    ("Penicillin", "Penicillin, the first widely used antibiotic, was discovered in 1928 by the Scottish scientist Alexander Fleming at St Mary's Hospital in London, after a mould killed bacteria on one of his culture plates.",
     [("Who discovered penicillin?", ["Alexander Fleming", "Fleming"]), ("In what year was penicillin discovered?", ["1928"])]),
    ("Johannes Gutenberg", "Johannes Gutenberg, a goldsmith from Mainz in Germany, introduced printing with movable metal type to Europe around 1440. The Gutenberg Bible was one of the first major books printed this way.",
     [("Who introduced printing with movable type to Europe?", ["Johannes Gutenberg", "Gutenberg"]), ("Which German city was Johannes Gutenberg from?", ["Mainz"])]),
    ("Wright brothers", "The Wright brothers, Orville and Wilbur Wright, made the first controlled, sustained flight of a powered aeroplane on 17 December 1903 near Kitty Hawk, North Carolina.",
     [("Who made the first powered aeroplane flight in 1903?", ["Wright brothers", "Orville and Wilbur Wright", "Wilbur and Orville Wright"]),
      ("Near which town did the Wright brothers make their first flight?", ["Kitty Hawk"]), ("In what year did the Wright brothers first fly?", ["1903"])]),
    ("Guglielmo Marconi", "Guglielmo Marconi was an Italian inventor who developed practical long-distance radio telegraphy in the 1890s. He sent the first radio signal across the Atlantic Ocean in 1901 and shared the 1909 Nobel Prize in Physics.",
     [("Which Italian inventor pioneered long-distance radio telegraphy?", ["Guglielmo Marconi", "Marconi"]), ("In what year was the first transatlantic radio signal sent?", ["1901"])]),
    ("James Watt", "James Watt was a Scottish engineer who greatly improved the steam engine in the 1760s and 1770s by adding a separate condenser. The watt, the unit of power, is named after him.",
     [("Which unit of power is named after James Watt?", ["watt"]), ("Who added a separate condenser to the steam engine?", ["James Watt", "Watt"])]),
    ("Samuel Morse", "Samuel Morse, an American painter and inventor, helped develop the electric telegraph and Morse code. In 1844 he sent the message \"What hath God wrought\" by telegraph from Washington to Baltimore.",
     [("Who helped develop the electric telegraph and the code named after him?", ["Samuel Morse", "Morse"]), ("What was the first message Samuel Morse sent from Washington to Baltimore?", ["What hath God wrought"])]),
    ("Cotton gin", "The American inventor Eli Whitney invented the cotton gin in 1793, a machine that quickly separates cotton fibres from their seeds.",
     [("Who invented the cotton gin?", ["Eli Whitney", "Whitney"])]),
    ("Edward Jenner", "Edward Jenner, an English physician, developed the first vaccine in 1796 by showing that infection with cowpox protected people against smallpox.",
     [("Who developed the first vaccine against smallpox?", ["Edward Jenner", "Jenner"]), ("Edward Jenner used cowpox to protect people against which disease?", ["smallpox"])]),
    ("Periodic table", "The Russian chemist Dmitri Mendeleev published a periodic table of the elements in 1869. He left gaps for elements that had not yet been discovered, such as gallium and germanium.",
     [("Who published the periodic table of the elements in 1869?", ["Dmitri Mendeleev", "Mendeleev", "Dmitri Ivanovich Mendeleev"]), ("In what year did Mendeleev publish his periodic table?", ["1869"])]),
    ("Albert Einstein", "Albert Einstein published the special theory of relativity in 1905 and the general theory of relativity in 1915. He received the 1921 Nobel Prize in Physics for his explanation of the photoelectric effect.",
     [("Who developed the theory of relativity?", ["Albert Einstein", "Einstein"]), ("For what did Albert Einstein receive the Nobel Prize in Physics?", ["photoelectric effect", "the photoelectric effect"]),
      ("In what year did Einstein publish the general theory of relativity?", ["1915"])]),
    ("Isaac Newton", "Isaac Newton, an English mathematician and physicist, described the laws of motion and universal gravitation in his book Principia, published in 1687. He also built the first practical reflecting telescope.",
     [("In which book did Isaac Newton set out the laws of motion?", ["Principia", "Philosophiae Naturalis Principia Mathematica"]), ("Who formulated the law of universal gravitation?", ["Isaac Newton", "Newton"])]),
    ("Polio vaccine", "Jonas Salk, an American virologist, developed the first successful polio vaccine, which was declared safe and effective in 1955.",
     [("Who developed the first successful polio vaccine?", ["Jonas Salk", "Salk"])]),
    ("X-rays", "The German physicist Wilhelm Roentgen discovered X-rays in 1895. For this discovery he received the first Nobel Prize in Physics, in 1901.",
     [("Who discovered X-rays?", ["Wilhelm Roentgen", "Roentgen", "Wilhelm Rontgen", "Wilhelm Conrad Roentgen"]), ("In what year were X-rays discovered?", ["1895"])]),
    ("Marie Curie", "Marie Curie was a Polish-born physicist and chemist who worked in France. With her husband Pierre Curie she discovered polonium and radium in 1898. She was the first woman to win a Nobel Prize and the only person to win Nobel Prizes in two different sciences, physics and chemistry.",
     [("Who was the first woman to win a Nobel Prize?", ["Marie Curie", "Marie Sklodowska Curie"]), ("Which element did Marie Curie name after Poland?", ["polonium"])]),
    ("DNA double helix", "In 1953 James Watson and Francis Crick proposed that DNA has the structure of a double helix, drawing on X-ray images made by Rosalind Franklin.",
     [("Who proposed the double helix structure of DNA in 1953?", ["James Watson and Francis Crick", "Watson and Crick", "Francis Crick and James Watson"]), ("What is the shape of the DNA molecule?", ["double helix"]),
      ("Whose X-ray images helped reveal the structure of DNA?", ["Rosalind Franklin", "Franklin"])]),
    ("Charles Darwin", "Charles Darwin, an English naturalist, set out the theory of evolution by natural selection in On the Origin of Species, published in 1859. His ideas grew out of the voyage of HMS Beagle, which visited the Galapagos Islands.",
     [("Who wrote On the Origin of Species?", ["Charles Darwin", "Darwin"]), ("On which ship did Charles Darwin sail to the Galapagos Islands?", ["HMS Beagle", "Beagle"]),
      ("In what year was On the Origin of Species published?", ["1859"])]),
    ("Louis Pasteur", "Louis Pasteur, a French chemist and microbiologist, developed pasteurisation, a heating process that kills microbes in milk and wine. He also made early vaccines against rabies and anthrax.",
     [("Which French scientist developed pasteurisation?", ["Louis Pasteur", "Pasteur"])]),
    ("Nikola Tesla", "Nikola Tesla, a Serbian-American engineer, designed the alternating current induction motor and promoted AC power systems. The tesla, the SI unit of magnetic flux density, is named after him.",
     [("Which SI unit is named after Nikola Tesla?", ["tesla"]), ("Who designed the alternating current induction motor?", ["Nikola Tesla", "Tesla"])]),
    ("Lightning rod", "Benjamin Franklin, one of the Founding Fathers of the United States, invented the lightning rod in the 1750s after his experiments with electricity, including his famous kite experiment.",
     [("Who invented the lightning rod?", ["Benjamin Franklin", "Franklin"])]),
    ("Analytical Engine", "Charles Babbage, an English mathematician, designed the Analytical Engine, a mechanical general-purpose computer, in the 1830s. Ada Lovelace wrote notes on the machine that are often called the first computer program.",
     [("Who designed the Analytical Engine?", ["Charles Babbage", "Babbage"]), ("Who is often called the first computer programmer?", ["Ada Lovelace", "Lovelace", "Augusta Ada King"])]),
    ("Alessandro Volta", "The Italian physicist Alessandro Volta built the voltaic pile, the first electric battery, in 1800. The volt, the unit of electric potential, is named after him.",
     [("Who invented the first electric battery?", ["Alessandro Volta", "Volta"]), ("Which unit of electric potential is named after Alessandro Volta?", ["volt"])]),
    ("Television", "The Scottish engineer John Logie Baird gave the first public demonstration of a working television system in London in 1926.",
     [("Who gave the first demonstration of a working television system in 1926?", ["John Logie Baird", "Baird"])]),
    ("Elisha Otis", "Elisha Otis, an American industrialist, invented a safety brake for elevators and demonstrated it in New York in 1854. His company, Otis Elevator, still exists today.",
     [("Who invented the safety elevator?", ["Elisha Otis", "Otis"])]),
    ("Rudolf Diesel", "Rudolf Diesel, a German engineer, invented the compression-ignition engine that bears his name in the 1890s.",
     [("Who invented the diesel engine?", ["Rudolf Diesel", "Diesel"])]),
    ("Louis Braille", "Louis Braille, a Frenchman who lost his sight as a child, created the braille system of raised dots for reading and writing, first published in 1829.",
     [("Who created a reading system of raised dots for blind people?", ["Louis Braille", "Braille"])]),
    ("Insulin", "Frederick Banting and Charles Best isolated the hormone insulin at the University of Toronto in 1921, making treatment of diabetes possible.",
     [("Which hormone did Banting and Best isolate in 1921?", ["insulin"]), ("Which disease is treated with insulin?", ["diabetes", "diabetes mellitus"]),
      ("At which university was insulin isolated?", ["University of Toronto", "Toronto"])]),
    ("Calculus", "Calculus was developed independently in the late 17th century by Isaac Newton and by the German mathematician Gottfried Wilhelm Leibniz, whose notation is still used today.",
     [("Which German mathematician developed calculus independently of Newton?", ["Gottfried Wilhelm Leibniz", "Leibniz", "Gottfried Leibniz"])]),
    ("Thomas Edison", "Thomas Edison, an American inventor, invented the phonograph in 1877 and developed a long-lasting incandescent light bulb in 1879 at his laboratory in Menlo Park, New Jersey.",
     [("Who invented the phonograph?", ["Thomas Edison", "Edison", "Thomas Alva Edison"]), ("Where was Thomas Edison's laboratory?", ["Menlo Park", "Menlo Park, New Jersey"])]),
    ("Galileo Galilei", "Galileo Galilei, an Italian astronomer, improved the telescope and in 1610 discovered the four largest moons of Jupiter, now called the Galilean moons.",
     [("Who discovered the four largest moons of Jupiter?", ["Galileo Galilei", "Galileo"]), ("In what year did Galileo discover the moons of Jupiter?", ["1610"])]),
    ("Nicolaus Copernicus", "Nicolaus Copernicus, a Polish astronomer, proposed a heliocentric model of the universe, with the Sun rather than the Earth at its centre, in a book published in 1543.",
     [("Who proposed a model with the Sun at the centre of the universe in 1543?", ["Nicolaus Copernicus", "Copernicus"])]),
    ("Gregor Mendel", "Gregor Mendel, an Augustinian friar, discovered the basic laws of heredity through experiments with pea plants in the 1850s and 1860s. He is known as the father of genetics.",
     [("Who is known as the father of genetics?", ["Gregor Mendel", "Mendel"]), ("Which plants did Gregor Mendel use in his experiments on heredity?", ["pea plants", "peas", "pea"])]),
    # --- space
    ("Mercury (planet)", "Mercury is the smallest planet in the Solar System and the closest to the Sun. It has no moons, and one orbit of the Sun takes about 88 Earth days.",
     [("Which planet is closest to the Sun?", ["Mercury"]), ("What is the smallest planet in the Solar System?", ["Mercury"]),
      ("How many Earth days does Mercury take to orbit the Sun?", ["88", "about 88", "88 days", "88 Earth days"])]),
    ("Venus", "Venus is the second planet from the Sun and the hottest planet in the Solar System, because its thick atmosphere of carbon dioxide traps heat. It often shines brightly as the morning or evening star.",
     [("What is the hottest planet in the Solar System?", ["Venus"]), ("What gas makes up most of the atmosphere of Venus?", ["carbon dioxide", "CO2"])]),
    ("Earth", "Earth is the third planet from the Sun and the only astronomical object known to support life. Its one natural satellite is the Moon, and water covers about 71 percent of its surface.",
     [("Which planet is third from the Sun?", ["Earth"]), ("What percentage of Earth's surface is covered by water?", ["71 percent", "71", "about 71 percent"])]),
    ("Mars", "Mars is the fourth planet from the Sun and is called the Red Planet because of the iron oxide on its surface. It has two small moons, Phobos and Deimos, and Olympus Mons, the largest volcano in the Solar System.",
     [("Which planet is known as the Red Planet?", ["Mars"]), ("What is the largest volcano in the Solar System?", ["Olympus Mons"]), ("What are the names of the two moons of Mars?", ["Phobos and Deimos", "Deimos and Phobos"])]),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest planet in the Solar System, a gas giant with a long-lived storm called the Great Red Spot. Its moon Ganymede is the largest moon in the Solar System.",
     [("What is the largest planet in the Solar System?", ["Jupiter"]), ("What is the largest moon in the Solar System?", ["Ganymede"]), ("What is the giant storm on Jupiter called?", ["Great Red Spot", "the Great Red Spot"])]),
    ("Saturn", "Saturn is the sixth planet from the Sun and is famous for its bright rings, made mostly of ice. Its largest moon, Titan, has a thick atmosphere and lakes of liquid methane.",
     [("What is the largest moon of Saturn?", ["Titan"]), ("Which planet is sixth from the Sun?", ["Saturn"])]),
    ("Uranus", "Uranus is the seventh planet from the Sun. It was discovered by William Herschel in 1781, and it rotates on its side, with an axial tilt of about 98 degrees.",
     [("Who discovered Uranus?", ["William Herschel", "Herschel"]), ("In what year was Uranus discovered?", ["1781"]), ("Which planet rotates on its side?", ["Uranus"])]),
    ("Neptune", "Neptune is the eighth and farthest known planet from the Sun. Its position was predicted by Urbain Le Verrier, and Johann Galle first observed it in 1846. Its largest moon is Triton.",
     [("Which planet is farthest from the Sun?", ["Neptune"]), ("What is the largest moon of Neptune?", ["Triton"]), ("In what year was Neptune first observed?", ["1846"])]),
    ("Pluto", "Pluto is a dwarf planet in the Kuiper belt. It was discovered by Clyde Tombaugh in 1930, and in 2006 the International Astronomical Union reclassified it from a planet to a dwarf planet.",
     [("Who discovered Pluto?", ["Clyde Tombaugh", "Tombaugh"]), ("In what year was Pluto reclassified as a dwarf planet?", ["2006"]), ("In what year was Pluto discovered?", ["1930"])]),
    ("Moon", "The Moon is Earth's only natural satellite. Neil Armstrong became the first person to walk on it on 20 July 1969, during the Apollo 11 mission.",
     [("Who was the first person to walk on the Moon?", ["Neil Armstrong", "Armstrong"]), ("Which mission first landed people on the Moon?", ["Apollo 11"])]),
    ("Sun", "The Sun is the star at the centre of the Solar System and is made mostly of hydrogen and helium. Its light takes about eight minutes to reach Earth.",
     [("How long does light from the Sun take to reach Earth?", ["eight minutes", "8 minutes", "about eight minutes", "about 8 minutes"])]),
    # --- rivers
    ("Nile", "The Nile is a major river of north-eastern Africa that flows north into the Mediterranean Sea. Its two main branches, the White Nile and the Blue Nile, meet at Khartoum in Sudan, and it passes through Cairo in Egypt.",
     [("Into which sea does the Nile flow?", ["Mediterranean Sea", "Mediterranean"]), ("In which city do the White Nile and the Blue Nile meet?", ["Khartoum"])]),
    ("Amazon River", "The Amazon River in South America carries more water than any other river in the world. It flows east through Peru, Colombia and Brazil to the Atlantic Ocean, across the largest tropical rainforest on Earth.",
     [("Which river carries the most water in the world?", ["Amazon", "Amazon River"]), ("Into which ocean does the Amazon River flow?", ["Atlantic Ocean", "Atlantic"])]),
    ("Yangtze", "The Yangtze is the longest river in Asia. It flows across China from the Tibetan Plateau to the East China Sea at Shanghai, and the Three Gorges Dam, one of the largest hydroelectric power stations in the world, spans it.",
     [("What is the longest river in Asia?", ["Yangtze", "Yangtze River", "Chang Jiang"]), ("Which large dam spans the Yangtze?", ["Three Gorges Dam"])]),
    ("Mississippi River", "The Mississippi River is one of the longest rivers in North America. It rises at Lake Itasca in Minnesota and flows south past St. Louis and New Orleans into the Gulf of Mexico.",
     [("Into which gulf does the Mississippi River flow?", ["Gulf of Mexico"]), ("At which lake does the Mississippi River rise?", ["Lake Itasca", "Itasca"])]),
    ("Danube", "The Danube is the second-longest river in Europe. It rises in the Black Forest of Germany and flows east through four capital cities, Vienna, Bratislava, Budapest and Belgrade, before it empties into the Black Sea.",
     [("Into which sea does the Danube flow?", ["Black Sea"]), ("In which forest does the Danube rise?", ["Black Forest"])]),
    ("Rhine", "The Rhine begins in the Swiss Alps and flows north past Basel and Cologne and through the Netherlands to the North Sea. Part of it forms the border between Germany and France.",
     [("Into which sea does the Rhine flow?", ["North Sea"])]),
    ("River Thames", "The Thames is the longest river entirely in England. It flows through Oxford and London before reaching the North Sea through the Thames Estuary.",
     [("Which river flows through London?", ["Thames", "River Thames"])]),
    ("Seine", "The Seine flows through Paris and Rouen in northern France and enters the English Channel at Le Havre.",
     [("Which river flows through Paris?", ["Seine", "River Seine"]), ("At which port does the Seine reach the English Channel?", ["Le Havre"])]),
    ("Ganges", "The Ganges rises at the Gangotri Glacier in the Himalayas and flows across northern India and Bangladesh into the Bay of Bengal. It is sacred in Hinduism, and the holy city of Varanasi lies on its banks.",
     [("Into which bay does the Ganges flow?", ["Bay of Bengal"]), ("Which river is sacred in Hinduism and flows past Varanasi?", ["Ganges", "Ganga"])]),
    ("Volga", "The Volga is the longest river in Europe. It flows through central Russia and empties into the Caspian Sea.",
     [("What is the longest river in Europe?", ["Volga", "Volga River"]), ("Into which sea does the Volga flow?", ["Caspian Sea", "Caspian"])]),
    ("Mekong", "The Mekong rises on the Tibetan Plateau and flows through China, Myanmar, Laos, Thailand, Cambodia and Vietnam before reaching the South China Sea through a large delta.",
     [("Into which sea does the Mekong flow?", ["South China Sea"])]),
    ("Congo River", "The Congo River in Central Africa is the deepest river in the world, with depths of more than 220 metres. It crosses the equator twice and flows into the Atlantic Ocean.",
     [("What is the deepest river in the world?", ["Congo", "Congo River"])]),
    ("Zambezi", "The Zambezi is the fourth-longest river in Africa. It plunges over Victoria Falls on the border of Zambia and Zimbabwe and flows into the Indian Ocean through Mozambique.",
     [("Which river plunges over Victoria Falls?", ["Zambezi", "Zambezi River"]), ("Into which ocean does the Zambezi flow?", ["Indian Ocean"])]),
    ("Tigris", "The Tigris flows from Turkey through Iraq, passing the city of Baghdad. With the Euphrates it framed ancient Mesopotamia, and the two rivers join to form the Shatt al-Arab, which flows into the Persian Gulf.",
     [("Which river flows through Baghdad?", ["Tigris", "Tigris River"]), ("What waterway is formed where the Tigris and the Euphrates join?", ["Shatt al-Arab"])]),
    ("Colorado River", "The Colorado River flows through the south-western United States and Mexico. Over millions of years it carved the Grand Canyon in Arizona, and the Hoover Dam holds back its water in Lake Mead.",
     [("Which river carved the Grand Canyon?", ["Colorado River", "Colorado"]), ("Which reservoir is held back by the Hoover Dam?", ["Lake Mead"])]),
    ("Saint Lawrence River", "The Saint Lawrence River flows north-east from Lake Ontario past Montreal and Quebec City to the Gulf of Saint Lawrence, linking the Great Lakes with the Atlantic Ocean.",
     [("Which river links the Great Lakes with the Atlantic Ocean?", ["Saint Lawrence River", "St. Lawrence River", "Saint Lawrence", "St. Lawrence"])]),
    ("Tiber", "The Tiber is the river of Rome. According to legend, Romulus and Remus founded the city on its banks.",
     [("On which river does Rome stand?", ["Tiber", "Tiber River"])]),
    ("Indus", "The Indus rises in Tibet and flows through Pakistan into the Arabian Sea. The Indus Valley Civilisation, with cities such as Harappa and Mohenjo-daro, grew up along it.",
     [("Along which river did the cities of Harappa and Mohenjo-daro grow up?", ["Indus", "Indus River"]), ("Into which sea does the Indus flow?", ["Arabian Sea"])]),
    # --- oceans, deserts, lakes, mountains
    ("Pacific Ocean", "The Pacific Ocean is the largest and deepest ocean on Earth. Its deepest point, the Challenger Deep in the Mariana Trench, lies about 11,000 metres below sea level.",
     [("What is the largest ocean on Earth?", ["Pacific Ocean", "Pacific"]), ("In which trench is the deepest point of the ocean?", ["Mariana Trench", "Marianas Trench"]),
      ("What is the deepest point of the Mariana Trench called?", ["Challenger Deep"])]),
    ("Atlantic Ocean", "The Atlantic Ocean is the second-largest ocean and separates the Americas from Europe and Africa. The Mid-Atlantic Ridge runs down its centre.",
     [("What is the second-largest ocean on Earth?", ["Atlantic Ocean", "Atlantic"])]),
    ("Arctic Ocean", "The Arctic Ocean is the smallest and shallowest of the world's five oceans and surrounds the North Pole.",
     [("What is the smallest ocean in the world?", ["Arctic Ocean", "Arctic"])]),
    ("Sahara", "The Sahara in North Africa is the largest hot desert in the world, covering most of the continent north of the Sahel.",
     [("What is the largest hot desert in the world?", ["Sahara", "Sahara Desert"])]),
    ("Atacama Desert", "The Atacama Desert in northern Chile is one of the driest places on Earth; some of its weather stations have never recorded rain.",
     [("Which desert in northern Chile is one of the driest places on Earth?", ["Atacama", "Atacama Desert"])]),
    ("Gobi Desert", "The Gobi Desert covers parts of northern China and southern Mongolia and is known for its dinosaur fossils.",
     [("Which desert covers parts of northern China and southern Mongolia?", ["Gobi", "Gobi Desert"])]),
    ("Lake Baikal", "Lake Baikal in Siberia, Russia, is the deepest lake in the world and holds roughly a fifth of the world's unfrozen fresh surface water.",
     [("What is the deepest lake in the world?", ["Lake Baikal", "Baikal"])]),
    ("Caspian Sea", "The Caspian Sea, between Europe and Asia, is the largest inland body of water on Earth by area. It is bordered by Russia, Kazakhstan, Turkmenistan, Iran and Azerbaijan.",
     [("What is the largest inland body of water on Earth?", ["Caspian Sea", "Caspian"])]),
    ("Lake Victoria", "Lake Victoria is the largest lake in Africa and is shared by Uganda, Kenya and Tanzania. It is a source of the White Nile.",
     [("What is the largest lake in Africa?", ["Lake Victoria", "Victoria"])]),
    ("Lake Superior", "Lake Superior is the largest of the Great Lakes of North America and the largest freshwater lake in the world by surface area.",
     [("What is the largest of the Great Lakes?", ["Lake Superior", "Superior"])]),
    ("Lake Titicaca", "Lake Titicaca lies high in the Andes on the border of Peru and Bolivia and is often called the highest navigable lake in the world.",
     [("Which lake lies on the border of Peru and Bolivia?", ["Lake Titicaca", "Titicaca"])]),
    ("Mount Everest", "Mount Everest, on the border of Nepal and China in the Himalayas, is the highest mountain on Earth, about 8,849 metres above sea level. Edmund Hillary and Tenzing Norgay first reached its summit in 1953.",
     [("What is the highest mountain on Earth?", ["Mount Everest", "Everest"]), ("Who first reached the summit of Mount Everest?", ["Edmund Hillary and Tenzing Norgay", "Hillary and Tenzing", "Tenzing Norgay and Edmund Hillary"]),
      ("In what year was Mount Everest first climbed?", ["1953"]), ("In which mountain range is Mount Everest?", ["Himalayas", "the Himalayas", "Himalaya"])]),
    ("K2", "K2, in the Karakoram range on the border of Pakistan and China, is the second-highest mountain on Earth.",
     [("What is the second-highest mountain on Earth?", ["K2"]), ("In which mountain range is K2?", ["Karakoram"])]),
    ("Mount Kilimanjaro", "Mount Kilimanjaro, a dormant volcano in Tanzania, is the highest mountain in Africa.",
     [("What is the highest mountain in Africa?", ["Mount Kilimanjaro", "Kilimanjaro"])]),
    ("Aconcagua", "Aconcagua, in the Andes of Argentina, is the highest mountain in South America and in the Western Hemisphere.",
     [("What is the highest mountain in South America?", ["Aconcagua"])]),
    ("Denali", "Denali, also called Mount McKinley, is the highest mountain in North America and rises in the Alaska Range.",
     [("What is the highest mountain in North America?", ["Denali", "Mount McKinley"])]),
    ("Mont Blanc", "Mont Blanc, on the border of France and Italy, is the highest mountain in the Alps.",
     [("What is the highest mountain in the Alps?", ["Mont Blanc"])]),
    ("Mount Elbrus", "Mount Elbrus, a dormant volcano in the Caucasus Mountains of Russia, is the highest mountain in Europe.",
     [("What is the highest mountain in Europe?", ["Mount Elbrus", "Elbrus"])]),
    ("Mount Fuji", "Mount Fuji, an active volcano on the island of Honshu, is the highest mountain in Japan and a national symbol.",
     [("What is the highest mountain in Japan?", ["Mount Fuji", "Fuji", "Fujisan"])]),
    # --- landmarks
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was built by the company of the engineer Gustave Eiffel for the 1889 World's Fair.",
     [("For which event was the Eiffel Tower built?", ["1889 World's Fair", "World's Fair", "Exposition Universelle"]), ("Whose company built the Eiffel Tower?", ["Gustave Eiffel", "Eiffel"]),
      ("In what year was the Eiffel Tower completed?", ["1889"])]),
    ("Statue of Liberty", "The Statue of Liberty stands on Liberty Island in New York Harbor. It was a gift from the people of France to the United States, was designed by Frederic Auguste Bartholdi and was dedicated in 1886.",
     [("Which country gave the Statue of Liberty to the United States?", ["France"]), ("Who designed the Statue of Liberty?", ["Frederic Auguste Bartholdi", "Bartholdi", "Auguste Bartholdi"]),
      ("In what year was the Statue of Liberty dedicated?", ["1886"])]),
    ("Taj Mahal", "The Taj Mahal is a white marble mausoleum in Agra, India. The Mughal emperor Shah Jahan built it in memory of his wife Mumtaz Mahal.",
     [("In which city is the Taj Mahal?", ["Agra"]), ("Which emperor built the Taj Mahal?", ["Shah Jahan"])]),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications built across northern China over many centuries; most of the surviving wall dates from the Ming dynasty.",
     [("From which dynasty does most of the surviving Great Wall of China date?", ["Ming", "Ming dynasty"])]),
    ("Colosseum", "The Colosseum in Rome is an ancient amphitheatre completed in 80 AD under the emperor Titus. It held tens of thousands of spectators for gladiator fights.",
     [("In which city is the Colosseum?", ["Rome"]), ("Under which emperor was the Colosseum completed?", ["Titus"])]),
    ("Machu Picchu", "Machu Picchu is a 15th-century Inca citadel high in the Andes of Peru, above the valley of the Urubamba River.",
     [("Which civilisation built Machu Picchu?", ["Inca", "Incas", "Inca Empire"]), ("In which country is Machu Picchu?", ["Peru"])]),
    ("Burj Khalifa", "The Burj Khalifa in Dubai, United Arab Emirates, has been the tallest building in the world since it opened in 2010; it is about 828 metres high.",
     [("What is the tallest building in the world?", ["Burj Khalifa"]), ("In which city is the Burj Khalifa?", ["Dubai"])]),
    ("Big Ben", "Big Ben is the nickname of the Great Bell of the clock at the north end of the Palace of Westminster in London. The clock tower was renamed Elizabeth Tower in 2012.",
     [("What is the official name of the tower that holds Big Ben?", ["Elizabeth Tower"])]),
    ("Sydney Opera House", "The Sydney Opera House, designed by the Danish architect Jorn Utzon, opened in 1973 on Sydney Harbour.",
     [("Who designed the Sydney Opera House?", ["Jorn Utzon", "Utzon"]), ("In what year did the Sydney Opera House open?", ["1973"])]),
    ("Christ the Redeemer", "Christ the Redeemer is a large Art Deco statue of Jesus on the Corcovado mountain above Rio de Janeiro, Brazil, completed in 1931.",
     [("In which city is the statue of Christ the Redeemer?", ["Rio de Janeiro", "Rio"]), ("On which mountain does Christ the Redeemer stand?", ["Corcovado"])]),
    ("Petra", "Petra is an ancient city in southern Jordan, famous for buildings carved into rose-coloured sandstone cliffs; it was the capital of the Nabataeans.",
     [("In which country is the ancient city of Petra?", ["Jordan"]), ("Which people made Petra their capital?", ["Nabataeans", "the Nabataeans"])]),
    ("Angkor Wat", "Angkor Wat in Cambodia is the largest religious monument in the world. It was built in the 12th century as a Hindu temple and later became Buddhist.",
     [("In which country is Angkor Wat?", ["Cambodia"])]),
    ("Stonehenge", "Stonehenge is a prehistoric ring of standing stones on Salisbury Plain in Wiltshire, England, built in stages from about 3000 BC.",
     [("On which plain does Stonehenge stand?", ["Salisbury Plain"])]),
    ("Parthenon", "The Parthenon is a temple on the Acropolis of Athens, completed in 438 BC and dedicated to the goddess Athena.",
     [("To which goddess is the Parthenon dedicated?", ["Athena"]), ("On which hill in Athens does the Parthenon stand?", ["Acropolis", "the Acropolis"])]),
    ("Golden Gate Bridge", "The Golden Gate Bridge is a suspension bridge across the Golden Gate strait at the entrance to San Francisco Bay. It opened in 1937.",
     [("In which city is the Golden Gate Bridge?", ["San Francisco"]), ("In what year did the Golden Gate Bridge open?", ["1937"])]),
    # --- composers
    ("Ludwig van Beethoven", "Ludwig van Beethoven was a German composer born in Bonn in 1770. His Ninth Symphony ends with the choral setting of the Ode to Joy, and he kept composing after he became deaf.",
     [("In which city was Ludwig van Beethoven born?", ["Bonn"]), ("Which composer's Ninth Symphony includes the Ode to Joy?", ["Ludwig van Beethoven", "Beethoven"])]),
    ("Wolfgang Amadeus Mozart", "Wolfgang Amadeus Mozart was an Austrian composer born in Salzburg in 1756. His operas include The Magic Flute, The Marriage of Figaro and Don Giovanni, and he died in Vienna in 1791.",
     [("In which city was Mozart born?", ["Salzburg"]), ("Who composed the opera The Magic Flute?", ["Wolfgang Amadeus Mozart", "Mozart"])]),
    ("Johann Sebastian Bach", "Johann Sebastian Bach was a German Baroque composer born in Eisenach in 1685. He wrote the Brandenburg Concertos and the Mass in B minor, and he spent his last decades as cantor of St Thomas Church in Leipzig.",
     [("Who composed the Brandenburg Concertos?", ["Johann Sebastian Bach", "Bach", "J. S. Bach"]), ("In which city was Bach the cantor of St Thomas Church?", ["Leipzig"])]),
    ("Antonio Vivaldi", "Antonio Vivaldi was a Baroque composer and violinist from Venice. His best-known work is The Four Seasons, a set of four violin concertos.",
     [("Who composed The Four Seasons?", ["Antonio Vivaldi", "Vivaldi"]), ("Which city was Antonio Vivaldi from?", ["Venice"])]),
    ("Pyotr Ilyich Tchaikovsky", "Pyotr Ilyich Tchaikovsky was a Russian composer of the Romantic period. His ballets Swan Lake, The Sleeping Beauty and The Nutcracker are among the most performed in the world.",
     [("Who composed the ballet Swan Lake?", ["Pyotr Ilyich Tchaikovsky", "Tchaikovsky"])]),
    ("Frederic Chopin", "Frederic Chopin was a Polish composer and virtuoso pianist, born near Warsaw in 1810, who spent most of his adult life in Paris. Almost all of his works are for solo piano.",
     [("For which instrument did Chopin write almost all of his works?", ["piano", "solo piano"]), ("What was the nationality of the composer Frederic Chopin?", ["Polish"])]),
    ("Giuseppe Verdi", "Giuseppe Verdi was an Italian opera composer whose works include Aida, La Traviata and Rigoletto.",
     [("Who composed the opera Aida?", ["Giuseppe Verdi", "Verdi"])]),
    ("Richard Wagner", "Richard Wagner was a German composer known for The Ring of the Nibelung, a cycle of four operas. A festival devoted to his works is held each summer in Bayreuth.",
     [("Who composed The Ring of the Nibelung?", ["Richard Wagner", "Wagner"]), ("In which town is a festival devoted to Wagner's operas held?", ["Bayreuth"])]),
    ("George Frideric Handel", "George Frideric Handel was a German-born Baroque composer who worked mostly in London. His oratorio Messiah was first performed in Dublin in 1742.",
     [("Who composed the oratorio Messiah?", ["George Frideric Handel", "Handel"]), ("In which city was Handel's Messiah first performed?", ["Dublin"])]),
    ("Joseph Haydn", "Joseph Haydn was an Austrian composer of the Classical period who wrote 104 symphonies and is often called the Father of the Symphony. He worked for many years for the Esterhazy family.",
     [("Which composer is called the Father of the Symphony?", ["Joseph Haydn", "Haydn"])]),
    ("Franz Schubert", "Franz Schubert was an Austrian composer who lived in Vienna from 1797 to 1828. He wrote more than 600 songs and a symphony known as the Unfinished Symphony.",
     [("Which composer wrote the Unfinished Symphony?", ["Franz Schubert", "Schubert"])]),
    ("Claude Debussy", "Claude Debussy was a French composer linked with Impressionism in music. His best-known pieces include Clair de lune and the orchestral work La Mer.",
     [("Who composed Clair de lune?", ["Claude Debussy", "Debussy"])]),
    ("Igor Stravinsky", "Igor Stravinsky was a Russian-born composer whose ballet The Rite of Spring caused an uproar at its premiere in Paris in 1913. He also wrote The Firebird.",
     [("Who composed The Rite of Spring?", ["Igor Stravinsky", "Stravinsky"]), ("In which city did The Rite of Spring have its premiere?", ["Paris"])]),
    ("Gustav Holst", "Gustav Holst was an English composer best known for The Planets, an orchestral suite in seven movements, one for each planet then known apart from Earth.",
     [("Which English composer wrote the orchestral suite The Planets?", ["Gustav Holst", "Holst"])]),
    ("Giacomo Puccini", "Giacomo Puccini was an Italian opera composer whose works include La Boheme, Tosca, Madama Butterfly and Turandot, which contains the aria Nessun dorma.",
     [("Who composed the opera Madama Butterfly?", ["Giacomo Puccini", "Puccini"]), ("Which opera contains the aria Nessun dorma?", ["Turandot"])]),
]


# ----------------------------------------------------------------------------- generation
def country_items(rng):
    out = []
    for name, cap, cont, where, cur, cur_alias, langs, extra, aliases in COUNTRIES:
        the = "the " if name in THE_COUNTRIES else ""
        text = rng.choice([f"{the.capitalize()}{name} is a country in {where}. Its capital is {cap}, and its currency is the {cur}.",
                           f"{the.capitalize()}{name} is a sovereign state in {where}. The capital city is {cap}. The currency is the {cur}."])
        if cont not in where:
            text += f" It is part of {cont}."
        if langs:
            text += (f" Its official language is {langs[0]}." if len(langs) == 1
                     else f" Its official languages are {', '.join(langs[:-1])} and {langs[-1]}.")
        text += " " + extra
        capitals = [cap] + (["Washington", "Washington DC"] if cap.startswith("Washington") else [])
        qa = [(rng.choice([f"What is the capital of {the}{name}?", f"Which city is the capital of {the}{name}?"]), capitals),
              (f"{cap} is the capital of which country?", [name] + aliases),
              (rng.choice([f"What is the currency of {the}{name}?", f"Which currency is used in {the}{name}?"]), [cur] + cur_alias),
              (f"What currency is used in the country whose capital is {cap}?", [cur] + cur_alias),
              (f"On which continent is {the}{name}?", [cont])]
        if langs:
            q = f"What is the official language of {the}{name}?" if len(langs) == 1 else f"What is an official language of {the}{name}?"
            qa.append((q, langs + [a for lang in langs for a in LANG_ALIASES.get(lang, [])]))
        out.append((name, text, qa))
    return out


def element_items(rng):
    out = []
    for name, sym, z, group, group_ans, extra, aliases in ELEMENTS:
        text = f"{name} is a chemical element with the symbol {sym} and atomic number {z}. It is {group}. {extra}"
        low = name.lower()
        qa = [(rng.choice([f"What is the chemical symbol of {low}?", f"What is the symbol for the element {low}?"]), [sym]),
              (f"What is the atomic number of {low}?", [str(z)])]
        if sym not in STOP_SYMBOLS:
            qa.append((f"Which chemical element has the symbol {sym}?", [name] + aliases))
        qa.append((f"Which element has atomic number {z}?", [name] + aliases))
        if group_ans:
            qa.append((f"To which group of elements does {low} belong?", group_ans))
        out.append((name, text, qa))
    return out


def book_items(rng):
    out = []
    for title, kind, author, a_alias, year, char, t_alias, desc in BOOKS:
        art = "an" if kind[0] in "aeiou" else "a"
        first = f"{title} is {art} {kind} by {author}" + (f", first published in {year}." if year else ".")
        text = f"{first} {desc}"
        qa = [(rng.choice([f"Who wrote {title}?", f"Who is the author of {title}?"]), [author] + a_alias)]
        if year:
            qa.append((f"In what year was {title} first published?", [str(year)]))
        if char:
            qa.append((f"In which work by {author} does {char} appear?", [title] + t_alias))
        out.append((title, text, qa))
    return out


def art_items(rng):
    out = []
    for title, artist, alias, year, places, verb, desc in ARTWORKS:
        text = f"{title} is a work {verb} by {artist}. {desc}"
        qa = [(f"Who {verb} {title}?", [artist] + alias)]
        if year:
            qa.append((f"In what year did {artist} create {title}?", [str(year)]))
        if places:
            qa.append((f"Where is {title} by {artist} kept?", places))
        out.append((title, text, qa))
    return out


def main():
    rng = random.Random(0)
    items = country_items(rng) + element_items(rng) + book_items(rng) + art_items(rng) + [(t, x, q) for t, x, q in PASSAGES]
    corpus, qas = [], []
    for i, (title, text, qa) in enumerate(items):
        corpus.append({"id": str(i), "contents": f'"{title}"\n{text}'})
        qas += [{"question": q, "golden_answers": a} for q, a in qa]
    rng.shuffle(qas)
    n_test = round(len(qas) * TEST_FRACTION)
    os.makedirs(os.path.join(HERE, "facts"), exist_ok=True)
    with open(os.path.join(HERE, "corpus.jsonl"), "w") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in corpus)
    for split, rows in (("test", qas[:n_test]), ("train", qas[n_test:])):
        with open(os.path.join(HERE, "facts", f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps({"id": f"{split}_{i}", **r}, ensure_ascii=False) + "\n" for i, r in enumerate(rows))
    print(f"{len(corpus)} passages, {len(qas)} questions ({n_test} test)")


if __name__ == "__main__":
    main()
